#!/usr/bin/env bash
# BENCHMARKS.md "PS shards added and removed while training (issue 39, item 3)": WDL on the
# peers' 1M rows (test 200k), 2 PS + 1 worker, checkpoints every 10 steps, once unscaled and
# once scaled 2 -> 3 (step 60) -> 2 (step 160); prints each job's line (wall, samples/s, AUC),
# its CPU, the table rows at the end, and the scaled job's moves (rows, bytes, seconds from
# order to switch, the switch's hold on its round) from the shards' logs.
# Usage: [BIN=target/release/sparta] [PEERS=/tmp/peers] [OUT=dir] bench/scale_ps.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${BIN:-$BENCH_ROOT/target/release/sparta}")
D=${PEERS:-/tmp/peers}/data
OUT=${OUT:-$(mktemp -d /tmp/scale-ps-XXXXXX)}
cd "$OUT"
machine
for run in unscaled scaled; do
  extra=()
  [ "$run" = scaled ] && extra=(--scale-ps-at 60:3 --scale-ps-at 160:2)
  rm -rf "$run"
  /usr/bin/time -f "$run: %e s wall, %U user, %S sys" env SPARTA_TOKEN=bench RUST_LOG=info \
    "$BIN" launch --ps 2 --workers 1 --train "$D/train.tsv" --test "$D/test.tsv" \
    --checkpoint-dir "$OUT/$run" --checkpoint-every-steps 10 --quiet \
    --summary-json "$run.json" "${extra[@]}" >"$run.log" 2>"$run.time"
  grep '^job:' "$run.log"
  tail -1 "$run.time"
  echo "$run: table rows $(jget "$run.json" table_rows), test AUC $(python3 -c "import json; print(repr(json.load(open('$run.json'))['test_auc']))")"
done
grep -E 'took [0-9]+ slot|launch: (scale|the cluster|ps[0-9]+ left)' scaled.log | sed 's/^\[ps[0-9]*\] [0-9T:.-]*Z  INFO //'
