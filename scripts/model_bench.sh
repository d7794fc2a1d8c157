#!/usr/bin/env bash
# The model-zoo table of BENCHMARKS.md ("Model zoo"): every model, one epoch, on the rich
# profile (a click, a conversion after it, a behaviour history) and on the real Criteo sample.
#   scripts/model_bench.sh DIR [CRITEO_SAMPLE]
# BIN (default target/release/sparta), ROWS (default 1000000), TEST_ROWS (default 200000).
# Writes DIR/<run>.json summaries and prints one markdown row per run.
set -euo pipefail
BIN=${BIN:-target/release/sparta}
DIR=${1:?usage: scripts/model_bench.sh DIR [CRITEO_SAMPLE]}
CRITEO=${2:-}
ROWS=${ROWS:-1000000}
TEST_ROWS=${TEST_ROWS:-200000}
mkdir -p "$DIR"
[ -s "$DIR/train.tsv" ] || "$BIN" gen-data --profile rich --rows "$ROWS" --seed 1 --out "$DIR/train.tsv"
[ -s "$DIR/test.tsv" ] || "$BIN" gen-data --profile rich --rows "$TEST_ROWS" --seed 2 --out "$DIR/test.tsv"
# the rich job, GAUC by user
cfg="$DIR/rich.toml"
{ cat examples/rich.toml; printf '\n[train]\ngauc_by = "user_id"\n'; } > "$cfg"
# din with the sequences mean-pooled: the same model without the attention
sed 's/^kind = "wdl"/kind = "din"\nsequence_pooling = "mean"/' "$cfg" > "$DIR/din-mean.toml"
# dcnv2 as a mixture of 4 rank-32 experts per cross layer
sed 's/^kind = "wdl"/kind = "dcnv2"\ncross_rank = 32\ncross_experts = 4/' "$cfg" > "$DIR/dcnv2-moe.toml"

row() { # name summary.json
  python3 - "$1" "$2" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
j = json.load(open(path))
tasks = j.get("test_tasks") or {"-": {"auc": j["test_auc"], "logloss": j["test_logloss"], "gauc": j.get("test_gauc")}}
def f(x, n=4):
    return "-" if x is None else f"{x:.{n}f}"
for t, m in tasks.items():
    print(f"| {name} | {t} | {f(m['auc'])} | {f(m.get('gauc'))} | {f(m['logloss'])} | "
          f"{j['train_samples_per_sec']:,.0f} | {j['dense_mflop_per_sample']:.3f} | {j['dense_gflops']:.1f} |")
PY
}

run() { # name config flags...
  local name=$1 config=$2; shift 2
  "$BIN" train --config "$config" "$@" --train "$DIR/train.tsv" --test "$DIR/test.tsv" \
    --quiet --summary-json "$DIR/$name.json" > "$DIR/$name.log"
  row "$name" "$DIR/$name.json"
}

echo "| run | task | test AUC | GAUC | logloss | samples/s | MFLOP/sample | dense GFLOP/s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for m in wdl deepfm dcn dcnv2 dlrm; do
  [ "$m" = deepfm ] || [ "$m" = dlrm ] && continue  # tables of several dims: FM and dot products need one
  run "$m" "$cfg" --model "$m"
done
run dcnv2-moe "$DIR/dcnv2-moe.toml"
run din "$cfg" --model din
run din-mean "$DIR/din-mean.toml"
run wdl-ctcvr "$cfg" --model wdl --task ctcvr=conversion
run din-ctcvr "$cfg" --model din --task ctcvr=conversion
run mmoe "$cfg" --model mmoe --task ctr=label --task ctcvr=conversion
run esmm "$cfg" --model esmm --task ctr=label --task ctcvr=conversion,after=ctr

if [ -n "$CRITEO" ]; then
  head -n 12000 "$CRITEO" > "$DIR/criteo-train.tsv"
  tail -n +12001 "$CRITEO" > "$DIR/criteo-test.tsv"
  printf '[train]\ngauc_by = "C1"\n' > "$DIR/criteo.toml"
  for m in wdl deepfm dcn dcnv2 dlrm mmoe; do
    "$BIN" train --config "$DIR/criteo.toml" --model "$m" --epochs 2 --batch-size 256 \
      --train "$DIR/criteo-train.tsv" --test "$DIR/criteo-test.tsv" --quiet \
      --summary-json "$DIR/criteo-$m.json" > "$DIR/criteo-$m.log"
    row "criteo $m" "$DIR/criteo-$m.json"
  done
  { cat "$DIR/criteo.toml"; printf '[model]\nkind = "dcnv2"\ncross_rank = 32\ncross_experts = 4\n'; } > "$DIR/criteo-moe.toml"
  "$BIN" train --config "$DIR/criteo-moe.toml" --epochs 2 --batch-size 256 \
    --train "$DIR/criteo-train.tsv" --test "$DIR/criteo-test.tsv" --quiet \
    --summary-json "$DIR/criteo-dcnv2-moe.json" > "$DIR/criteo-dcnv2-moe.log"
  row "criteo dcnv2-moe" "$DIR/criteo-dcnv2-moe.json"
fi
