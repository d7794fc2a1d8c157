#!/usr/bin/env bash
# BENCHMARKS.md: "Parquet per core (issue 41)": `sparta bench read` on one generated data set as
# TSV, Parquet zstd and Parquet snappy, one parser thread, the previous binary (OLD) and this
# one (NEW) alternating ROUNDS times (rows per CPU second of the process); then, with NEW,
# `sparta train` (the default WDL job) on the Parquet and on the TSV of the same rows, with the
# same test file.
# Usage: OLD=/path/to/prev/sparta [NEW=target/release/sparta] [ROUNDS=3] [TRAIN=1] \
#        DATA=/folder bench/parquet_read.sh
# (DATA gets train.tsv / test.tsv from `sparta gen-data` (1M rows seed 1, 200k rows seed 2) and
# train.zstd.parquet / train.snappy.parquet from `sparta convert` when they are not there.)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
OLD=$(realpath "${OLD:?the release sparta binary of the previous main}")
NEW=$(realpath "${NEW:-target/release/sparta}")
ROUNDS=${ROUNDS:-3}
TRAIN=${TRAIN:-1}
cd "${DATA:?folder for the data}"
[ -f train.tsv ] || "$NEW" gen-data --rows 1000000 --seed 1 --out train.tsv >/dev/null
[ -f test.tsv ] || "$NEW" gen-data --rows 200000 --seed 2 --out test.tsv >/dev/null
for codec in zstd snappy; do
  [ -f "train.$codec.parquet" ] ||
    "$NEW" convert --input train.tsv --out "train.$codec.parquet" --compression "$codec" >/dev/null
done
machine
echo "round binary input rows_per_cpu_sec cpu_secs rows bad_rows"
for round in $(seq 1 "$ROUNDS"); do
  for which in OLD NEW; do
    bin=${!which}
    for input in train.tsv train.zstd.parquet train.snappy.parquet; do
      out="read-$which-$round-$input.json"
      "$bin" bench read --input "$input" --threads 1 >"$out"
      echo "$round $which $input $(jget "$out" rows_per_cpu_sec) $(jget "$out" cpu_secs)" \
        "$(jget "$out" rows) $(jget "$out" bad_rows)"
    done
  done
done
[ "$TRAIN" = 1 ] || exit 0
echo "train input test_auc samples/s"
for input in train.zstd.parquet train.tsv; do
  out="train-$input.json"
  "$NEW" train --train "$input" --test test.tsv --quiet --summary-json "$out" >/dev/null 2>&1
  echo "$input $(jget "$out" test_auc) $(jget "$out" train_samples_per_sec)"
done
