#!/usr/bin/env bash
# BENCHMARKS.md "The SSD tier (issue 40)": the default `sparta train` job (WDL) all in RAM and
# with `[embedding] storage = { ram_rows = 20 % of its embedding rows }`, alternating ROUNDS
# times on one data set; prints test AUC, rows, cold rows, disk bytes, peak RSS and samples/s.
# Usage: [BIN=target/release/sparta] [ROUNDS=2] [RAM_SHARE=0.2] DATA=/folder/with/train.tsv+test.tsv bench/ssd_tier.sh
# (data: `sparta gen-data --rows 1000000 --seed 1 --out train.tsv`, `--rows 200000 --seed 2`)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${BIN:-target/release/sparta}")
ROUNDS=${ROUNDS:-2}
cd "${DATA:?folder with train.tsv and test.tsv}"
machine
mkdir -p tier-disk
: > ram.toml
report() {
  python3 -c "
import json; j = json.load(open('$2'))
print('$1', j['test_auc'], j['table_rows'], j['table_cold_rows'], j['table_disk_bytes'],
      j['peak_rss_bytes'], round(j['train_samples_per_sec']))"
}
# The embedding rows of this data: one all-RAM run (the wide table holds as many).
"$BIN" train --config ram.toml --train train.tsv --test test.tsv --quiet --summary-json tier-ram-0.json >/dev/null 2>&1
RAM_ROWS=$(python3 -c "import json; print(int(json.load(open('tier-ram-0.json'))['table_rows'] / 2 * ${RAM_SHARE:-0.2}))")
printf '[embedding]\nstorage = { ram_rows = %s, disk_dir = "%s" }\n' "$RAM_ROWS" "$PWD/tier-disk" > tier.toml
echo "ram_rows = $RAM_ROWS"
echo "run auc rows cold_rows disk_bytes peak_rss samples/s"
report ram-0 tier-ram-0.json
for r in $(seq 1 "$ROUNDS"); do
  for c in tier ram; do
    "$BIN" train --config "$c.toml" --train train.tsv --test test.tsv --quiet \
      --summary-json "tier-$c-$r.json" >/dev/null 2>&1
    report "$c-$r" "tier-$c-$r.json"
  done
done
