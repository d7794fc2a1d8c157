#!/usr/bin/env bash
# Feature-columns benchmarks (issue 13), release binary, run side by side:
#   1. rich profile (1M rows): the explicit feature config (examples/rich.toml) vs every column
#      flattened into tables of one dim (no [[features]], [embedding] dim = 16);
#   2. criteo 1M: the default WDL job with the previous binary ($PREV) and this one, alternating;
#   3. criteo 1M: the 26 column tables in one hash table (the default) vs 26 hash tables.
# Usage: scripts/feature_bench.sh CRITEO_DIR RICH_DIR PREV_BINARY
# (CRITEO_DIR/{train,test}.tsv from gen_synth_criteo.py; RICH_DIR/{train,test}.tsv from
# `sparta gen-data --profile rich`; RICH_DIR/flat.toml = examples/rich.toml without its
# [[tables]] / [[features]] plus `[embedding] dim = 16`.)
set -euo pipefail
CRITEO=$1 RICH=$2 PREV=$3
NEW=${NEW:-./target/release/sparta}
OUT=${OUT:-/tmp/feature_bench}
mkdir -p "$OUT"
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], 'auc %.4f logloss %.4f samples/s %.0f train_s %.1f rows %d' % (d['test_auc'], d['test_logloss'], d['train_samples_per_sec'], d['train_seconds'], d['table_rows']))" "$1" "$2"; }
lscpu | grep 'Model name'
# 1. rich: explicit vs flat
"$NEW" train --config examples/rich.toml --train "$RICH/train.tsv" --test "$RICH/test.tsv" --quiet --summary-json "$OUT/rich-explicit.json"
show "$OUT/rich-explicit.json" rich-explicit
python3 -c "import json; print(json.load(open('$OUT/rich-explicit.json'))['tables'])"
"$NEW" train --config "$RICH/flat.toml" --train "$RICH/train.tsv" --test "$RICH/test.tsv" --quiet --summary-json "$OUT/rich-flat.json"
show "$OUT/rich-flat.json" rich-flat
# 2. criteo default, previous vs new, alternating
for i in 1 2; do
  "$PREV" train --train "$CRITEO/train.tsv" --test "$CRITEO/test.tsv" --quiet --summary-json "$OUT/prev-$i.json"
  show "$OUT/prev-$i.json" "criteo prev $i"
  "$NEW" train --train "$CRITEO/train.tsv" --test "$CRITEO/test.tsv" --quiet --summary-json "$OUT/new-$i.json"
  show "$OUT/new-$i.json" "criteo new $i"
done
# 3. one hash table for the 26 tables vs 26 (distinct init bounds keep them apart)
"$NEW" config show --format criteo > "$OUT/one.toml"
python3 - "$OUT/one.toml" "$OUT/many.toml" <<'PY'
import sys
text = open(sys.argv[1]).read()
out, i = [], 0
for block in text.split("[[tables]]"):
    if i > 0:
        block = block.replace("dim = 16\n", "dim = 16\ninit = { type = \"uniform\", low = -0.05, high = %.6f }\n" % (0.05 + 1e-6 * i), 1)
    out.append(block)
    i += 1
open(sys.argv[2], "w").write("[[tables]]".join(out))
PY
"$NEW" train --config "$OUT/one.toml" --train "$CRITEO/train.tsv" --test "$CRITEO/test.tsv" --quiet --summary-json "$OUT/one.json"
show "$OUT/one.json" "criteo 26 tables in 1 hash table"
"$NEW" train --config "$OUT/many.toml" --train "$CRITEO/train.tsv" --test "$CRITEO/test.tsv" --quiet --summary-json "$OUT/many.json"
show "$OUT/many.json" "criteo 26 tables in 26 hash tables"
