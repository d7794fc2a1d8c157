#!/usr/bin/env bash
# BENCHMARKS.md "Cost of progressive validation (issue 38)": the default WDL job on the 1M-row
# set with progressive validation on (the default) and off (`[metrics] progressive = false`),
# the same release binary, alternating ROUNDS times; samples/s over the training time
# (reading and parsing included) and over the training loop alone, and the test AUC (the same
# model either way: progressive validation only reads the training step's scores).
# Usage: [BIN=target/release/sparta] [ROUNDS=3] DATA=/folder/with/train.tsv+test.tsv \
#        bench/progressive_cost.sh
# (data: `sparta gen-data --rows 1000000 --seed 1 --out train.tsv`, `--rows 200000 --seed 2`)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${BIN:-$BENCH_ROOT/target/release/sparta}")
ROUNDS=${ROUNDS:-3}
cd "${DATA:?folder with train.tsv and test.tsv}"
printf '[metrics]\nprogressive = false\n' > progressive-off.toml
printf '' > progressive-on.toml
machine
echo "round which test_auc samples/s loop_samples/s"
for round in $(seq 1 "$ROUNDS"); do
  for which in on off; do
    "$BIN" train --config "progressive-$which.toml" --train train.tsv --test test.tsv --quiet \
      --summary-json "p-$which-$round.json" >/dev/null 2>&1
    echo "$round $which $(jget "p-$which-$round.json" test_auc) $(jget "p-$which-$round.json" train_samples_per_sec) $(jget "p-$which-$round.json" loop_samples_per_sec)"
  done
done
# Instructions (callgrind counts them reproducibly on a noisy machine): CALLGRIND_ROWS rows of
# the training set, no test set, on and off; the whole process (reading, parsing, training,
# the final window report) counted.
if [ -n "${CALLGRIND_ROWS:-}" ]; then
  echo "callgrind, --max-rows $CALLGRIND_ROWS: which instructions"
  for which in on off; do
    valgrind --tool=callgrind --callgrind-out-file="cg-$which.out" "$BIN" train \
      --config "progressive-$which.toml" --train train.tsv --max-rows "$CALLGRIND_ROWS" \
      --quiet >/dev/null 2>"cg-$which.log"
    echo "$which $(sed -n 's/.*Collected : *\([0-9]*\).*/\1/p' "cg-$which.log")"
  done
fi
