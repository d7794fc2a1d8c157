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
OLD=$(realpath "${OLD:?the release sparta binary of the previous main}")
NEW=$(realpath "${NEW:-target/release/sparta}")
ROUNDS=${ROUNDS:-5}
cd "${DATA:?folder with train.tsv and test.tsv}"
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed -E 's/^(Flags:).*/\1 '"$(grep -o -w -E 'avx2|avx512f|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"'/'
echo "run which auc samples/s"
for round in $(seq 1 "$ROUNDS"); do
  for which in OLD NEW; do
    bin=${!which}
    "$bin" train --train train.tsv --test test.tsv --quiet --summary-json "s-$which-$round.json" >/dev/null 2>&1
    python3 -c "import json,sys; s=json.load(open('s-$which-$round.json')); print('$round $which', '%.4f' % s['test_auc'], '%.0f' % s['train_samples_per_sec'])"
  done
done
