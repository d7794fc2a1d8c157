#!/usr/bin/env bash
# Issue 34 (BENCHMARKS.md): side by side, alternating, the previous main's release binary (OLD)
# and this change's (NEW): WDL-1M embedded, then 2 PS + 2 workers async and sync (200k rows).
# Usage: OLD=/path/to/old/sparta DATA=/path/to/data bench/issue34_side_by_side.sh
set -u
OLD=${OLD:?the release sparta binary of the previous main}
NEW=$(realpath "${NEW:-target/release/sparta}")
OLD=$(realpath "$OLD")
cd "${DATA:?folder with train.tsv (gen-data --rows 1000000) and test.tsv (--rows 100000 --seed 2)}"
lscpu | grep -E "Model name|^CPU\(s\)" 
for round in 1 2; do
  for which in OLD NEW; do
    bin=${!which}
    $bin train --train train.tsv --test test.tsv --quiet --summary-json emb-$which-$round.json > /dev/null 2>&1
    python3 -c "import json;s=json.load(open('emb-$which-$round.json'));print('wdl-1M $which r$round', 'samples/s %.0f'%s['train_samples_per_sec'], 'loop %.0f'%s['loop_samples_per_sec'], 'auc %.5f'%s['test_auc'])"
  done
done
for round in 1 2; do
  for which in OLD NEW; do
    bin=${!which}
    SPARTA_BIN=$bin $bin launch --ps 2 --workers 2 --mode ${MODE:-async} --train train.tsv --max-rows 200000 --test test.tsv --quiet --summary-json l22-$which-$round.json > l22-$which-$round.log 2>&1
    python3 - "$which" "$round" <<'PY'
import json,sys
w,r=sys.argv[1:]
s=json.load(open(f'l22-{w}-{r}.json'))
def find(d,k):
    if isinstance(d,dict):
        if k in d: return d[k]
        for v in d.values():
            x=find(v,k)
            if x is not None: return x
    if isinstance(d,list):
        for v in d:
            x=find(v,k)
            if x is not None: return x
print('2ps+2w', w, 'r'+r, 'samples/s', find(s,'train_samples_per_sec'), 'auc', find(s,'test_auc'), 'rpcs/step', find(s,'rpcs_per_step'))
PY
  done
done
# The sync rows of the table: the same loop with MODE=sync.
