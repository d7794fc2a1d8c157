#!/usr/bin/env bash
# BENCHMARKS.md: "Restructuring (issue 12)", "Feature columns and named tables (issue 13)" (the
# default WDL job, previous main vs this one) and "Model zoo" (no regression for the existing
# models): the default `sparta train` job on one data set, the previous main's release binary
# (OLD) and this one's (NEW) alternating, ROUNDS times. Written afterwards: those sections ran
# these commands by hand.
# Usage: OLD=/path/to/prev/sparta [NEW=target/release/sparta] [ROUNDS=5] \
#        DATA=/folder/with/train.tsv+test.tsv bench/train_alternating.sh
# (data: `sparta gen-data --rows 1000000 --seed 1 --out train.tsv`, `--rows 200000 --seed 2`)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
OLD=$(realpath "${OLD:?the release sparta binary of the previous main}")
NEW=$(realpath "${NEW:-target/release/sparta}")
ROUNDS=${ROUNDS:-5}
cd "${DATA:?folder with train.tsv and test.tsv}"
machine
echo "run which auc samples/s"
for round in $(seq 1 "$ROUNDS"); do
  for which in OLD NEW; do
    bin=${!which}
    "$bin" train --train train.tsv --test test.tsv --quiet --summary-json "s-$which-$round.json" >/dev/null 2>&1
    echo "$round $which $(jget "s-$which-$round.json" test_auc) $(jget "s-$which-$round.json" train_samples_per_sec)"
  done
done
