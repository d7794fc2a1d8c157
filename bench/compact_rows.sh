#!/usr/bin/env bash
# BENCHMARKS.md "Compact rows (issue 40)": the default `sparta train` job at
# `[embedding] precision = f32, f16, bf16, int8` (or $PRECISIONS), one run each, on one data set; prints test AUC,
# table rows, the payload bytes of every logical table (key + stored floats), the table bytes
# and samples/s.
# Usage: [BIN=target/release/sparta] [PRECISIONS="f32 int8"] [CONFIG=examples/rich.toml] DATA=/folder/with/train.tsv+test.tsv bench/compact_rows.sh
# (data: `sparta gen-data --rows 1000000 --seed 1 --out train.tsv`, `--rows 200000 --seed 2`)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${BIN:-target/release/sparta}")
[ -n "${CONFIG:-}" ] && CONFIG=$(realpath "$CONFIG")
cd "${DATA:?folder with train.tsv and test.tsv}"
machine
echo "precision auc rows payload_bytes table_bytes samples/s"
for p in ${PRECISIONS:-f32 f16 bf16 int8}; do
  # With CONFIG (e.g. examples/rich.toml for `--profile rich` data): that job, its tables at
  # precision $p (an [embedding] section appended: the job must not have one).
  { [ -n "${CONFIG:-}" ] && cat "$CONFIG"; printf '[embedding]\nprecision = "%s"\n' "$p"; } > "precision-$p.toml"
  "$BIN" train --config "precision-$p.toml" --train train.tsv --test test.tsv --quiet \
    --summary-json "c-$p.json" >/dev/null 2>&1
  python3 -c "
import json; j = json.load(open('c-$p.json'))
pay = sum(t['bytes'] for t in j['tables'].values())
print('$p', j['test_auc'], j['table_rows'], pay, j['table_bytes'], round(j['train_samples_per_sec']))"
done
