#!/usr/bin/env bash
# The time a rejoining PS takes to get its copy: 2 PS processes with --replicas 2 (each holds
# both shards), a coordinator, one worker trains one epoch of ROWS `sparta gen-data
# --vocab-scale VOCAB` rows (wdl, batch 4096); then process 1 is killed (-9) and restarted with
# the same flags (what a StatefulSet does), with nothing training, and process 0, primary of both
# shards by then, copies each shard to it. Prints the primaries' log lines `copied N rows and the
# dense slice to ... in S s` and `the backup on process 1 caught up`, with the seconds since the
# restart at which each appeared, and the time from the kill to both copies in sync.
# Backs "The time a rejoining PS takes to copy 10M rows" in BENCHMARKS.md "Failover against
# rollback, checkpoint rounds through a failover (issue 16, third step)" (was
# `/tmp/rj/run.sh BIN 2000000 3000`, lost; reconstructed from the section's text).
#
# Usage: bench/rejoin_copy_time.sh [BIN [ROWS [VOCAB]]]   (defaults: target/release/sparta,
#        2000000, 3000; the section's smaller run: 1000000 1000)
# Environment: PORT (27170: PS on PORT and PORT+1, the coordinator on PORT+2), WAIT (300: most
# seconds to wait for the copies), RESTART_AFTER (3: seconds from the kill to the restart, past
# the coordinator's --dead-after-ms), WORK (a temporary folder).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${1:-$BENCH_ROOT/target/release/sparta}")
ROWS=${2:-2000000}
VOCAB=${3:-3000}
PORT=${PORT:-27170}
WAIT=${WAIT:-300}
WORK=${WORK:-$(mktemp -d -t rejoin-XXXXXX)}
mkdir -p "$WORK"
SPARTA_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export SPARTA_TOKEN RUST_LOG=${RUST_LOG:-info}
[ -s "$WORK/train-$ROWS-$VOCAB.tsv" ] ||
    "$BIN" gen-data --rows "$ROWS" --vocab-scale "$VOCAB" --out "$WORK/train-$ROWS-$VOCAB.tsv" >/dev/null

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
peers=127.0.0.1:$PORT,127.0.0.1:$((PORT + 1))
ps_start() { # process index, log
    "$BIN" ps --shard "$1" --num-shards 2 --workers 1 --replicas 2 --peers "$peers" \
        --listen 127.0.0.1:$((PORT + $1)) >"$2" 2>&1 &
    PIDS+=($!)
    PS_PID=$!
}
ps_start 0 "$WORK/ps0.log"
ps_start 1 "$WORK/ps1.log"; PS1=$PS_PID
"$BIN" coordinator --ps "$peers" --replicas 2 --listen 127.0.0.1:$((PORT + 2)) >"$WORK/coord.log" 2>&1 &
PIDS+=($!)
sleep 2
machine
echo "training one epoch of $ROWS rows (--vocab-scale $VOCAB), work $WORK"
"$BIN" worker --rank 0 --num-workers 1 --ps "$peers" --coordinator 127.0.0.1:$((PORT + 2)) \
    --model wdl --batch-size 4096 --epochs 1 --train "$WORK/train-$ROWS-$VOCAB.tsv" --quiet \
    --summary-json "$WORK/w0.json" >"$WORK/w0.log" 2>&1 || echo "worker exited with $?"
echo "trained: $(jget "$WORK/w0.json" samples_trained) samples, $(jget "$WORK/w0.json" train_samples_per_sec) samples/s"
grep -h 'rows' "$WORK/w0.log" | tail -2
kill -9 "$PS1"
wait "$PS1" 2>/dev/null
t_kill=$(date +%s.%N)
echo "killed process 1 (pid $PS1) at $(date -u +%T)"
# the coordinator fails its shards over after --dead-after-ms (1000 by default)
sleep "${RESTART_AFTER:-3}"
base=$(wc -l <"$WORK/ps0.log")
ps_start 1 "$WORK/ps1-rejoin.log"
t_restart=$(date +%s.%N)
echo "restarted process 1 (pid $PS_PID) at $(date -u +%T)"
declare -A seen
while :; do
    now=$(date +%s.%N)
    while IFS= read -r line; do
        [ -n "${seen[$line]:-}" ] && continue
        seen[$line]=1
        echo "  +$(python3 -c "print(f'{$now - $t_restart:.2f}')") s after the restart: $line"
    done < <(tail -n +$((base + 1)) "$WORK/ps0.log" | grep -E 'copied [0-9]+ rows|caught up' | sed 's/\x1b\[[0-9;]*m//g')
    n=$(tail -n +$((base + 1)) "$WORK/ps0.log" | grep -c 'caught up')
    if [ "$n" -ge 2 ]; then
        echo "kill to both copies in sync: $(python3 -c "print(f'{$now - $t_kill:.1f}')") s (polled every 0.05 s)"
        break
    fi
    if python3 -c "import sys; sys.exit(0 if $now - $t_restart > $WAIT else 1)"; then
        echo "no two 'caught up' lines within $WAIT s; see $WORK/ps0.log" >&2
        break
    fi
    sleep 0.05
done
echo "peak RSS of process 0: $(grep -m1 VmHWM /proc/"${PIDS[0]}"/status 2>/dev/null | awk '{print $2, $3}')"
