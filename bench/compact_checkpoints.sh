#!/usr/bin/env bash
# BENCHMARKS.md "int8 rows" and "Compact rows", checkpoints and exports of compact tables: the
# default `sparta train` job on ROWS generated rows at `[embedding] precision = f32, f16, bf16,
# int8`, each writing its end-of-job checkpoint; prints the checkpoint's bytes (`du -sb`) and
# those of a full export of it (`sparta export --checkpoint`).
# Usage: [BIN=target/release/sparta] [ROWS=200000] bench/compact_checkpoints.sh WORKDIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${BIN:-target/release/sparta}")
mkdir -p "${1:?work directory}" && cd "$1"
machine
[ -f train.tsv ] || "$BIN" gen-data --rows "${ROWS:-200000}" --seed 1 --out train.tsv >/dev/null
echo "precision checkpoint_bytes export_bytes"
for p in f32 f16 bf16 int8; do
  printf '[embedding]\nprecision = "%s"\n' "$p" > "$p.toml"
  rm -rf "ck-$p" "ex-$p"
  "$BIN" train --config "$p.toml" --train train.tsv --quiet --checkpoint-dir "ck-$p" \
    --summary-json "s-$p.json" >/dev/null 2>&1
  "$BIN" export --checkpoint "ck-$p" --out "ex-$p" >/dev/null 2>&1
  echo "$p $(du -sb "ck-$p" | cut -f1) $(du -sb "ex-$p" | cut -f1)"
done
