#!/usr/bin/env bash
# Failover against rollback: one `sparta launch` job with --replicas 1 and 2, each with and
# without a `kill -9` of ps1 KILL_AFTER seconds after the launch, the four jobs alternated.
# Backs BENCHMARKS.md "Failover against rollback, checkpoint rounds through a failover (issue 16,
# third step)" (was /tmp/fob/run2.sh, lost; reconstructed from the section's text: the four jobs
# alternated, three rounds, kill -9 of ps1 12 s after the launch), and runs the commands of
# "Failover against rollback, release build (issue 16, second step)" (ROUNDS=2 per binary).
#
# The job: 400,000 `sparta gen-data` rows (test: 50,000, seed 2), wdl, batch 1024, 3 PS + 2
# workers, async, one epoch, one thread per process, checkpoints every 60 steps.
#
# Usage: [SPARTA=target/release/sparta] [ROWS=400000] [TEST_ROWS=50000] [ROUNDS=3]
#        [KILL_AFTER=12] [CKPT_EVERY=60] [WORK=dir] bench/failover_vs_rollback.sh
# Prints per job: wall, samples/s and samples trained (launch summary), restarts, rollbacks,
# failovers and rejoins, and worker 0's slowest steps (the pause around the kill).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SPARTA=$(realpath "${SPARTA:-$BENCH_ROOT/target/release/sparta}")
ROWS=${ROWS:-400000}
TEST_ROWS=${TEST_ROWS:-50000}
ROUNDS=${ROUNDS:-3}
KILL_AFTER=${KILL_AFTER:-12}
CKPT_EVERY=${CKPT_EVERY:-60}
WORK=${WORK:-$(mktemp -d -t failover-XXXXXX)}
mkdir -p "$WORK"
unset SPARTA_TOKEN
[ -s "$WORK/train.tsv" ] || "$SPARTA" gen-data --rows "$ROWS" --out "$WORK/train.tsv" >/dev/null
[ -s "$WORK/test.tsv" ] || "$SPARTA" gen-data --rows "$TEST_ROWS" --seed 2 --out "$WORK/test.tsv" >/dev/null

job() { # R kill(0|1) round
    local r=$1 kill=$2 name="r$1-kill$2-$3" lpid t0 t1 ps1
    local dir="$WORK/$name"
    rm -rf "$dir"; mkdir -p "$dir"
    t0=$(date +%s.%N)
    "$SPARTA" launch --ps 3 --workers 2 --replicas "$r" --model wdl --batch-size 1024 --epochs 1 \
        --threads 1 --train "$WORK/train.tsv" --test "$WORK/test.tsv" --quiet \
        --summary-json "$dir/out.json" --checkpoint-dir "$dir/ckpt" \
        --checkpoint-every-steps "$CKPT_EVERY" >"$dir/launch.log" 2>&1 &
    lpid=$!
    if [ "$kill" = 1 ]; then
        sleep "$KILL_AFTER"
        ps1=$(grep -o 'launch: started ps1 (pid [0-9]*' "$dir/launch.log" | tail -1 | grep -o '[0-9]*$')
        if [ -n "$ps1" ] && kill -0 "$ps1" 2>/dev/null; then
            kill -9 "$ps1"; echo "  killed ps1 (pid $ps1) at $(date -u +%T)"
        else
            echo "  ps1 not running at ${KILL_AFTER}s (job over?): no kill"
        fi
    fi
    wait "$lpid"; local rc=$?
    t1=$(date +%s.%N)
    python3 - "$dir/out.json" "$name" "$rc" "$(python3 -c "print(f'{$t1 - $t0:.1f}')")" <<'PY'
import json, sys
path, name, rc, wall = sys.argv[1:]
try:
    j = json.load(open(path))
except Exception as e:
    print(f"{name}: rc {rc}, wall {wall} s, no summary ({e})"); sys.exit()
w0 = (j.get("per_worker") or [{}])[0]
slow = ", ".join(f"#{s.get('step')} {s.get('seconds', 0):.2f} s" for s in (w0.get("slowest_steps") or [])[:3])
med = {k: v for k, v in w0.items() if "median" in k}
print(f"{name}: rc {rc}, wall {wall} s, samples/s {j.get('train_samples_per_sec', 0):,.0f}, "
      f"samples {j.get('samples_trained')}, auc {j.get('test_auc')}, restarts {j.get('restarts')}, "
      f"rollbacks {j.get('rollbacks')}, failovers {j.get('failovers')}, rejoins {j.get('rejoins')}; "
      f"worker 0 {med} slowest {slow}")
PY
}

machine
echo "$ROWS rows, kill -9 of ps1 after ${KILL_AFTER}s, checkpoints every $CKPT_EVERY steps, work $WORK"
for round in $(seq 1 "$ROUNDS"); do
    for spec in "1 0" "2 0" "1 1" "2 1"; do
        # shellcheck disable=SC2086
        job $spec "$round"
    done
done
