#!/usr/bin/env bash
# Training from S3 on loopback against local files (BENCHMARKS.md, "Input from object
# storage"): moto_server holds ROWS generated rows as OBJECTS objects; training reads them
# directly and through scripts/latency_proxy.py adding DELAY_MS per request. Prints each run's
# train seconds, source wait and reader wait. Needs scripts/test-deps.sh (moto) and curl.
# Env: SPARTA (binary, default target/release/sparta), ROWS (default 1000000), OBJECTS (4),
# DELAY_MS (20), THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test-deps.sh >/dev/null
bin="${SPARTA:-target/release/sparta}"
rows="${ROWS:-1000000}" objects="${OBJECTS:-4}" delay="${DELAY_MS:-20}" threads="${THREADS:-2}"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=$((20000 + RANDOM % 20000)); pport=$((port + 1))
"$SPARTA_MOTO_SERVER" -H 127.0.0.1 -p "$port" >/dev/null 2>&1 &
python3 scripts/latency_proxy.py --listen "$pport" --upstream "127.0.0.1:$port" --delay-ms "$delay" &
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.1; done
curl -sf -X PUT "http://127.0.0.1:$port/bench" >/dev/null
"$bin" gen-data --rows "$rows" --seed 1 --out "$work/all.tsv" >/dev/null
split -n "l/$objects" -d --additional-suffix=.tsv "$work/all.tsv" "$work/part-"
rm "$work/all.tsv"
for f in "$work"/part-*.tsv; do
    curl -sf -X PUT -H "Content-Type: application/octet-stream" --data-binary "@$f" "http://127.0.0.1:$port/bench/in/$(basename "$f")" >/dev/null
done
export AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x AWS_REGION=us-east-1
run() {
    local name="$1" endpoint="$2"; shift 2
    AWS_ENDPOINT="$endpoint" "$bin" train --model wdl --threads "$threads" --quiet \
        --summary-json "$work/$name.json" --train "$@" >/dev/null
    python3 - "$work/$name.json" "$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); i = j["input"]; st = j["stage_seconds"]
t = j["train_seconds"]
print(f"{sys.argv[2]:>14}: {j['train_rows']} rows in {t:.2f} s ({j['train_samples_per_sec']:.0f}/s); "
      f"source wait {i['source_wait_seconds']:.3f} s ({100*i['source_wait_seconds']/t:.2f}%), "
      f"reader wait {st['read']:.3f} s ({100*st['read']/t:.2f}%), fetched {i['source_bytes']} B, "
      f"retries {i['source_retries']}")
PY
}
run local "" "$work"/part-*.tsv
run s3 "http://127.0.0.1:$port" "s3://bench/in/"
run "s3+${delay}ms" "http://127.0.0.1:$pport" "s3://bench/in/"
