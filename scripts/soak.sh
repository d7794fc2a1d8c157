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
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SPARTA=${SPARTA:-$ROOT/target/release/sparta}
WORK=${WORK:-$(mktemp -d -t sparta-soak-XXXXXX)}
[ -x "$SPARTA" ] || { echo "no $SPARTA: cargo build --release -p sparta (or set SPARTA)"; exit 2; }
mkdir -p "$WORK"
export RUST_LOG=warn
unset SPARTA_TOKEN
RANDOM=$SEED

"$SPARTA" gen-data --rows "$ROWS" --seed 1 --vocab-scale 0.01 --out "$WORK/train.tsv" >/dev/null
"$SPARTA" gen-data --rows $((ROWS / 5)) --seed 2 --vocab-scale 0.01 --out "$WORK/test.tsv" >/dev/null
EXPECT=$((ROWS * EPOCHS))

# launch CKPT SUMMARY LOG RESTARTS: the job, in the background; sets LPID.
launch() {
    rm -rf "$1"
    "$SPARTA" launch --ps 2 --workers 2 --mode sync --model wdl --batch-size 256 \
        --epochs "$EPOCHS" --threads 1 --reader-threads 1 --seed 7 \
        --train "$WORK/train.tsv" --test "$WORK/test.tsv" --quiet \
        --checkpoint-dir "$1" --checkpoint-every-steps 20 --max-restarts "$4" \
        --ps-retry-secs 30 --summary-json "$2" >"$3" 2>&1 &
    LPID=$!
}

# pid LOG NAME: the newest pid `sparta launch` printed for NAME (ps0, w1).
pid() { grep -o "launch: started $2 (pid [0-9]*" "$1" | tail -1 | grep -o '[0-9]*$'; }
# newest DIR: the newest committed checkpoint's name in DIR.
newest() { ls -d "$1"/*/manifest.ckpt 2>/dev/null | sort | tail -1; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))" "$1" "$2"; }

t0=$(date +%s)
launch "$WORK/ref-ckpt" "$WORK/ref.json" "$WORK/ref.log" 0
wait "$LPID" || { echo "reference run failed:"; tail -20 "$WORK/ref.log"; exit 1; }
REF_AUC=$(field "$WORK/ref.json" test_auc)
echo "reference: $(field "$WORK/ref.json" samples_trained) samples, AUC $REF_AUC, $(($(date +%s) - t0)) s ($ROWS rows x $EPOCHS epochs, seed $SEED, work dir $WORK)"

ck="$WORK/soak-ckpt" out="$WORK/soak.json" log="$WORK/soak.log"
t0=$(date +%s)
launch "$ck" "$out" "$log" $((KILLS * 2))
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
