#!/usr/bin/env bash
# Chaos runs of `sparta launch` (not part of `cargo test`): a 2 PS + 2 worker sync job with
# checkpoints, faulted at a random point of each run, then checked against an uninterrupted
# reference run: the job must exit 0 with every sample trained exactly once
# (samples_trained = rows x epochs) and a test AUC within TOL of the reference.
#
#   scripts/chaos.sh [ITERATIONS]          (default 10; env: ROWS, EPOCHS, TOL, SPARTA, WORK)
#
# Scenarios (round robin): kill -9 of a PS, of a worker, of a PS and a worker at once, of a PS
# twice in a row, SIGSTOP of a worker for a few seconds then SIGCONT, SIGSTOP of a PS then
# SIGCONT. Each fault lands at a random time after the run's first committed checkpoint.
# Prints one line per run and a summary; exits non-zero if any run failed its checks.
set -u

ITER=${1:-10}
ROWS=${ROWS:-100000}
EPOCHS=${EPOCHS:-2}
TOL=${TOL:-0.003}
NAME=chaos
# shellcheck source=scripts/cluster_job.sh
. "$(dirname "$0")/cluster_job.sh"

# committed DIR: committed checkpoints in DIR.
committed() { ls "$1"/*/manifest.ckpt 2>/dev/null | wc -l; }

# wait_ckpt DIR N: until DIR holds more than N committed checkpoints (or the job ended).
wait_ckpt() {
    while [ "$(committed "$1")" -le "$2" ] && kill -0 "$LPID" 2>/dev/null; do sleep 0.1; done
}

launch "$WORK/ref-ckpt" "$WORK/ref.json" "$WORK/ref.log" 5 6
wait "$LPID" || { echo "reference run failed:"; tail -20 "$WORK/ref.log"; exit 1; }
REF_AUC=$(field "$WORK/ref.json" test_auc)
echo "reference: $(field "$WORK/ref.json" samples_trained) samples, AUC $REF_AUC ($ROWS rows x $EPOCHS epochs, work dir $WORK)"

SCENARIOS=(kill-ps kill-worker kill-ps-and-worker kill-ps-twice stop-worker stop-ps)
FAILED=0
for i in $(seq 1 "$ITER"); do
    sc=${SCENARIOS[$(((i - 1) % ${#SCENARIOS[@]}))]}
    ck="$WORK/ckpt-$i" out="$WORK/run-$i.json" log="$WORK/run-$i.log"
    t0=$(date +%s.%N)
    launch "$ck" "$out" "$log" 5 6
    wait_ckpt "$ck" 0
    sleep "$(python3 -c "import random; print(round(random.uniform(0, 2), 2))")"
    ps=ps$((RANDOM % 2)) w=w$((RANDOM % 2))
    case $sc in
    kill-ps) kill -9 "$(pid "$log" "$ps")" ;;
    kill-worker) kill -9 "$(pid "$log" "$w")" ;;
    kill-ps-and-worker) kill -9 "$(pid "$log" "$ps")" "$(pid "$log" "$w")" ;;
    kill-ps-twice)
        old=$(pid "$log" "$ps")
        kill -9 "$old"
        while [ "$(pid "$log" "$ps")" = "$old" ] && kill -0 "$LPID" 2>/dev/null; do sleep 0.1; done
        wait_ckpt "$ck" "$(committed "$ck")"
        kill -9 "$(pid "$log" "$ps")"
        ;;
    stop-worker | stop-ps)
        [ "$sc" = stop-ps ] && who=$ps || who=$w
        p=$(pid "$log" "$who")
        kill -STOP "$p"
        sleep 5
        kill -CONT "$p"
        ;;
    esac
    wait "$LPID"
    rc=$?
    secs=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
    if [ "$rc" -ne 0 ] || [ ! -f "$out" ]; then
        echo "run $i $sc: FAILED (exit $rc, ${secs}s), log $log"
        FAILED=$((FAILED + 1))
        continue
    fi
    samples=$(field "$out" samples_trained) auc=$(field "$out" test_auc)
    restarts=$(python3 -c "import json; j=json.load(open('$out')); print(json.dumps(j['restarts'], separators=(',', ':')), j['rollbacks'])")
    verdict=ok
    [ "$samples" = "$EXPECT" ] || verdict="FAILED: samples $samples != $EXPECT"
    python3 -c "import sys; sys.exit(abs($auc - $REF_AUC) > $TOL)" || verdict="FAILED: AUC off by more than $TOL"
    [ "$verdict" = ok ] || FAILED=$((FAILED + 1))
    echo "run $i $sc: $verdict: samples $samples, AUC $auc (ref $REF_AUC), restarts+rollbacks $restarts, ${secs}s"
done
echo "chaos: $((ITER - FAILED)) of $ITER runs passed"
[ "$FAILED" -eq 0 ]
