#!/usr/bin/env bash
# BENCHMARKS.md "The cluster path against the embedded job: CPU per sample (issue 41, item 3)":
# WDL on the peers' 1M training rows, no test set, f32; per round `sparta train` (embedded) then
# `sparta launch --ps 1 --workers 1`; then one `sparta launch --ps 2 --workers 2`. CPU is user +
# system of the whole process tree (`/usr/bin/time`; the launcher waits for its children);
# samples/s and wire bytes from the summaries.
# Usage: [BIN=target/release/sparta] [PEERS=/tmp/peers] [ROUNDS=2] [OUT=dir] bench/cluster_cpu.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${BIN:-$BENCH_ROOT/target/release/sparta}")
D=${PEERS:-/tmp/peers}/data
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-$(mktemp -d /tmp/cluster-cpu-XXXXXX)}
cd "$OUT"
machine
run() { # NAME ARGS...: one run, its CPU and samples/s
  local name=$1
  shift
  /usr/bin/time -f "%e %U %S" env SPARTA_TOKEN=bench "$BIN" "$@" --train "$D/train.tsv" \
    --quiet --summary-json "$name.json" >"$name.log" 2>"$name.time"
  read -r wall user sys < <(tail -1 "$name.time")
  echo "$name: wall $wall s, CPU $(python3 -c "print(f'{$user + $sys:.2f}')") s, samples/s $(jget "$name.json" train_samples_per_sec), wire B/sample $(jget "$name.json" wire.bytes_per_sample)"
}
for r in $(seq 1 "$ROUNDS"); do
  run "embedded-$r" train
  run "ps1-w1-$r" launch --ps 1 --workers 1
done
run ps2-w2 launch --ps 2 --workers 2
