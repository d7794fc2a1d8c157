#!/usr/bin/env bash
# Soak run of `sparta launch` (issue 18; not part of `cargo test`): ONE 2 PS + 2 worker sync job
# with checkpoints, killed (-9) KILLS times at random (a random PS or worker each time, at a
# random 0-1.5 s after the job committed a new checkpoint since the previous kill), checked
# against an uninterrupted reference run: the job must exit 0 with every sample trained exactly
# once (samples_trained = rows x epochs) and a test AUC within TOL of the reference.
#
#   scripts/soak.sh [KILLS]     (default 20; env: ROWS, EPOCHS, TOL, SPARTA, WORK, SEED)
#
# Prints the reference, one line per kill, and the verdict; exits non-zero when a check fails.
set -u

KILLS=${1:-20}
ROWS=${ROWS:-200000}
EPOCHS=${EPOCHS:-3}
TOL=${TOL:-0.003}
SEED=${SEED:-$RANDOM}
NAME=soak
# shellcheck source=scripts/cluster_job.sh
. "$(dirname "$0")/cluster_job.sh"
RANDOM=$SEED

# newest DIR: the newest committed checkpoint's name in DIR.
newest() { ls -d "$1"/*/manifest.ckpt 2>/dev/null | sort | tail -1; }

t0=$(date +%s)
launch "$WORK/ref-ckpt" "$WORK/ref.json" "$WORK/ref.log" 20 0
wait "$LPID" || { echo "reference run failed:"; tail -20 "$WORK/ref.log"; exit 1; }
REF_AUC=$(field "$WORK/ref.json" test_auc)
echo "reference: $(field "$WORK/ref.json" samples_trained) samples, AUC $REF_AUC, $(($(date +%s) - t0)) s ($ROWS rows x $EPOCHS epochs, seed $SEED, work dir $WORK)"

ck="$WORK/soak-ckpt" out="$WORK/soak.json" log="$WORK/soak.log"
t0=$(date +%s)
launch "$ck" "$out" "$log" 20 $((KILLS * 2))
done_kills=0
last=""
while [ "$done_kills" -lt "$KILLS" ] && kill -0 "$LPID" 2>/dev/null; do
    # Progress since the last kill: a checkpoint committed after the restart.
    while [ "$(newest "$ck")" = "$last" ] && kill -0 "$LPID" 2>/dev/null; do sleep 0.1; done
    kill -0 "$LPID" 2>/dev/null || break
    last=$(newest "$ck")
    sleep "$(python3 -c "import random; random.seed($SEED + $done_kills); print(round(random.uniform(0, 1.5), 2))")"
    case $((RANDOM % 4)) in
    0) who=ps0 ;; 1) who=ps1 ;; 2) who=w0 ;; *) who=w1 ;;
    esac
    p=$(pid "$log" "$who")
    if [ -n "$p" ] && kill -9 "$p" 2>/dev/null; then
        done_kills=$((done_kills + 1))
        echo "kill $done_kills: $who (pid $p) after $(basename "$(dirname "$last")"), $(($(date +%s) - t0)) s into the run"
    fi
done
wait "$LPID"
rc=$?
secs=$(($(date +%s) - t0))
if [ "$rc" -ne 0 ] || [ ! -f "$out" ]; then
    echo "soak: FAILED (exit $rc, ${secs}s, $done_kills kills), log $log"
    tail -20 "$log"
    exit 1
fi
samples=$(field "$out" samples_trained) auc=$(field "$out" test_auc)
restarts=$(python3 -c "import json; j=json.load(open('$out')); print(json.dumps(j['restarts'], separators=(',', ':')), 'rollbacks', j['rollbacks'])")
verdict=ok
[ "$done_kills" -eq "$KILLS" ] || verdict="FAILED: the job ended after $done_kills of $KILLS kills (more ROWS or EPOCHS)"
[ "$samples" = "$EXPECT" ] || verdict="FAILED: samples $samples != $EXPECT"
python3 -c "import sys; sys.exit(abs($auc - $REF_AUC) > $TOL)" || verdict="FAILED: AUC off by more than $TOL"
echo "soak: $verdict: $done_kills kills, samples $samples (expected $EXPECT), AUC $auc (ref $REF_AUC, |diff| $(python3 -c "print(round(abs($auc - $REF_AUC), 5))")), restarts $restarts, ${secs}s"
[ "$verdict" = ok ]
