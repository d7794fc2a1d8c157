#!/usr/bin/env bash
# Replication traffic of replicated PS shards: the failover benchmark's job started by hand
# (3 `sparta ps --metrics-listen`, a coordinator when R > 1, 2 workers), and after the job the
# three PS's `sparta_replication_bytes_total` summed, in bytes and bytes per trained sample.
# Backs the "Replication traffic" figure of BENCHMARKS.md "Failover against rollback, checkpoint
# rounds through a failover (issue 16, third step)" (was `/tmp/rb/run.sh BIN R`, lost;
# reconstructed from the section's text).
#
# Usage: bench/replication_traffic.sh [BIN [R]]   (BIN default target/release/sparta, R default 2)
# Environment: ROWS (400000), TEST_ROWS (50000), BATCH (1024), CKPT_EVERY (60; 0: no
# checkpoints), PORT (27070: PS i on PORT+i, its metrics on PORT+10+i, the coordinator on
# PORT+20), WORK (a temporary folder). The job: wdl, 3 PS + 2 workers, async, one epoch, one
# thread per process.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${1:-$BENCH_ROOT/target/release/sparta}")
R=${2:-2}
ROWS=${ROWS:-400000}
TEST_ROWS=${TEST_ROWS:-50000}
BATCH=${BATCH:-1024}
CKPT_EVERY=${CKPT_EVERY:-60}
PORT=${PORT:-27070}
WORK=${WORK:-$(mktemp -d -t replbytes-XXXXXX)}
mkdir -p "$WORK"
SPARTA_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export SPARTA_TOKEN
[ -s "$WORK/train.tsv" ] || "$BIN" gen-data --rows "$ROWS" --out "$WORK/train.tsv" >/dev/null
[ -s "$WORK/test.tsv" ] || "$BIN" gen-data --rows "$TEST_ROWS" --seed 2 --out "$WORK/test.tsv" >/dev/null
"$BIN" config show --model wdl | sed "s/^batch_size = .*/batch_size = $BATCH/" >"$WORK/job.toml"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
peers=127.0.0.1:$PORT,127.0.0.1:$((PORT + 1)),127.0.0.1:$((PORT + 2))
ckpt=()
[ "$CKPT_EVERY" != 0 ] && ckpt=(--checkpoint-dir "$WORK/ckpt-r$R")
rm -rf "$WORK/ckpt-r$R"
for i in 0 1 2; do
    repl=()
    [ "$R" -gt 1 ] && repl=(--replicas "$R" --peers "$peers")
    "$BIN" ps --shard $i --num-shards 3 --workers 2 --mode async --config "$WORK/job.toml" \
        --listen 127.0.0.1:$((PORT + i)) --metrics-listen 127.0.0.1:$((PORT + 10 + i)) \
        "${repl[@]}" "${ckpt[@]}" >"$WORK/ps$i-r$R.log" 2>&1 &
    PIDS+=($!)
done
coord=()
if [ "$R" -gt 1 ]; then
    "$BIN" coordinator --ps "$peers" --replicas "$R" --listen 127.0.0.1:$((PORT + 20)) \
        >"$WORK/coord-r$R.log" 2>&1 &
    PIDS+=($!)
    coord=(--coordinator 127.0.0.1:$((PORT + 20)))
fi
sleep 2
machine
WPIDS=()
for j in 0 1; do
    test=()
    [ $j = 0 ] && test=(--test "$WORK/test.tsv")
    wck=()
    [ "$CKPT_EVERY" != 0 ] && wck=(--checkpoint-dir "$WORK/ckpt-r$R" --checkpoint-every-steps "$CKPT_EVERY")
    "$BIN" worker --rank $j --num-workers 2 --ps "$peers" "${coord[@]}" --config "$WORK/job.toml" \
        --model wdl --batch-size "$BATCH" --epochs 1 --threads 1 --train "$WORK/train.tsv" \
        "${test[@]}" "${wck[@]}" --quiet --summary-json "$WORK/w$j-r$R.json" >"$WORK/w$j-r$R.log" 2>&1 &
    WPIDS+=($!)
done
for p in "${WPIDS[@]}"; do wait "$p" || echo "worker pid $p exited with $?"; done
total=0
for i in 0 1 2; do
    b=$(python3 - "http://127.0.0.1:$((PORT + 10 + i))/metrics" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
print(int(sum(float(l.split()[-1]) for l in text.splitlines()
              if l.startswith("sparta_replication_bytes_total"))))
PY
)
    echo "ps$i sparta_replication_bytes_total $b"
    total=$((total + ${b:-0}))
done
samples=$(( $(jget "$WORK/w0-r$R.json" samples_trained | tr -d ,) + $(jget "$WORK/w1-r$R.json" samples_trained | tr -d ,) ))
echo "R=$R: $total replication bytes over $samples samples = $(( samples > 0 ? total / samples : 0 )) bytes per sample" \
    "(worker 0 wire: $(jget "$WORK/w0-r$R.json" wire.bytes_sent) sent, $(jget "$WORK/w0-r$R.json" wire.bytes_received) received)"
