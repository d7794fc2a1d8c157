#!/bin/bash
# The planner's predictions against a measured run (BENCHMARKS.md, "sparta plan"): a 2 PS +
# 1 worker `sparta launch` on ROWS generated rows, then `sparta plan --ps 2` with --ids set to
# the rows that run created, on the same rows; prints predicted vs measured wire bytes per
# sample and table bytes.
# usage: bench/plan_check.sh ROWS [CONFIG]   (env SPARTA: the binary, default target/release/sparta)
set -euo pipefail
S=${SPARTA:-target/release/sparta}
R=$1; CFG=${2:-}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
D=$W/t$R.tsv
"$S" gen-data --rows "$R" --seed 1 --out "$D" >/dev/null
CF=(); [ -n "$CFG" ] && CF=(--config "$CFG")
"$S" launch --ps 2 --workers 1 "${CF[@]}" --train "$D" --quiet --summary-json "$W/l.json" >/dev/null 2>&1
read -r E WIDE B <<<"$(python3 -c "
import json;s=json.load(open('$W/l.json'))
r={};b=0
for sh in s['shard_tables']:
  for k,v in sh['tables'].items(): r[k]=r.get(k,0)+v['rows']; b+=v['bytes']
print(r['embedding'],r['wide'],b)")"
"$S" plan --ps 2 "${CF[@]}" --ids "embedding=$E,wide=$WIDE" --data "$D" --sample-rows "$R" \
  --samples-per-sec 1M --machine-memory 64GiB --json 2>/dev/null > "$W/p.json"
python3 - "$W" "$R" "$E" "$WIDE" "$B" <<'PY'
import json, sys
w, rows, e, wide, b = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
s = json.load(open(f"{w}/l.json")); p = json.load(open(f"{w}/p.json"))
wire = s['per_worker'][0]['wire']
pb = sum(t['bytes_per_shard'] for t in p['tables']) * 2
ps, ms = p['wire']['sparse_bytes_per_sample'], wire['sparse_bytes_per_sample']
print(f"rows {rows}: ids embedding={e} wide={wide}")
print(f"  sparse B/sample: predicted {ps:.2f} measured {ms:.2f} ({100*(ps/ms-1):+.2f}%)")
print(f"  dense B/sample: predicted (full batches) {p['wire']['dense_bytes_per_sample']:.1f} measured {wire['dense_bytes_per_sample']:.1f} (steps {s['steps']})")
print(f"  table bytes (2 shards): predicted {pb} measured {b} ({100*(pb/b-1):+.2f}%)")
print("  bytes/row:", [(t['name'], round(t['bytes_per_row'], 1), t['measured_rows']) for t in p['tables']])
print(f"  cpu/sample {p['workers']['cpu_seconds_per_sample']:.3g} s, workers {p['workers']['count']}")
PY
