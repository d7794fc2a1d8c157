#!/usr/bin/env bash
# Adds seed inputs to the corpora of the fuzz targets in fuzz/corpus/<target>/ (not committed).
#
# Text seeds come from the real samples in $SPARTA_DATA (default ../shared/data next to the
# repository: criteo/*.tsv, avazu/*.csv) when present, else from `sparta gen-data`; a few
# lines per seed, never whole files. The rich layout's lines always come from
# `sparta gen-data --profile rich`. Checkpoint and export targets build their valid files in
# the harness: their seeds only pick each file with an empty patch list.
#
# Usage: fuzz/seeds.sh            (the sparta binary: $SPARTA_BIN, target/debug/sparta, or cargo run)
set -euo pipefail
fuzz="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$fuzz")"
data="${SPARTA_DATA:-$root/../shared/data}"
corpus="$fuzz/corpus"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

sparta() {
    if [ -n "${SPARTA_BIN:-}" ]; then
        "$SPARTA_BIN" "$@"
    elif [ -x "$root/target/debug/sparta" ]; then
        "$root/target/debug/sparta" "$@"
    else
        (cd "$root" && cargo run -q -p sparta -- "$@")
    fi
}

# Source lines per layout (the order of sparta_fuzz::layouts()): criteo, avazu, generic, rich, wide.
criteo="$(ls "$data"/criteo/*sample.tsv 2>/dev/null | head -1 || true)"
avazu="$(ls "$data"/avazu/*.csv 2>/dev/null | head -1 || true)"
if [ -n "$criteo" ]; then
    head -n 200 "$criteo" >"$work/0"
    echo "seeds: criteo lines from $criteo"
else
    sparta gen-data --rows 200 --seed 3 --out "$work/0" >/dev/null 2>&1
    echo "seeds: criteo lines from sparta gen-data"
fi
if [ -n "$avazu" ]; then
    head -n 200 "$avazu" >"$work/1"
    echo "seeds: avazu lines from $avazu"
else
    # The Avazu layout from generated Criteo rows: id, click, then 22 categorical fields.
    awk -F'\t' 'BEGIN{print "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21"}
        {l=NR "," $1; for(i=15;i<=36;i++) l=l "," $i; print l}' "$work/0" >"$work/1"
    echo "seeds: avazu lines from generated rows"
fi
sparta gen-data --profile rich --rows 200 --seed 3 --out "$work/3" >/dev/null 2>&1
# generic: ts,clicked,price,user,tags(;),ad with a header
awk -F'\t' 'BEGIN{print "ts,clicked,price,user,tags,ad"}
    {printf "%d,%s,%s,%s,%s;%s;%s,%s\n", NR, $1, $2, $15, $16, $17, $18, $19}' "$work/0" >"$work/2"
# wide: label, 40 dense, 30 sparse, a space-separated sequence
awk -F'\t' 'BEGIN{OFS="\t"} {l=$1; for(i=0;i<40;i++) l=l OFS $(2+i%13); for(i=0;i<30;i++) l=l OFS $(15+i%26);
    print l, $15 " " $16 " " $17 " " $18}' "$work/0" >"$work/4"

# Seeds are added next to what earlier runs found (same-named seeds are rewritten).
mkdir -p "$corpus"/{line_parser,feeder,predict_request,checkpoint_files,export_files,ps_wire,kafka_batches}
for layout in 0 1 2 3 4; do
    pick="$(printf '\\%03o' "$layout")"
    # line_parser: 1, 2, 4 and 8 lines from different places.
    for n in 1 2 4 8; do
        for at in 2 40 120; do
            { printf "$pick"; sed -n "${at},$((at + n - 1))p" "$work/$layout"; } \
                >"$corpus/line_parser/l${layout}-${n}-${at}"
        done
    done
    # feeder: the first 30 lines (header included), modes 0 (one member) and 64 (two).
    for mode in 0 64; do
        { printf "$(printf '\\%03o' $((layout + mode)))"; head -n 30 "$work/$layout"; } \
            >"$corpus/feeder/f${layout}-${mode}"
    done
    # predict_request: lines as a tsv request (tabs and quotes escaped for JSON).
    { printf "$pick"; printf '{"tsv": ['
      sed -n '2,4p' "$work/$layout" | awk '{gsub(/\\/,"\\\\"); gsub(/"/,"\\\""); gsub(/\t/,"\\t");
          printf "%s\"%s\"", (NR>1?", ":""), $0}'
      printf ']}'; } >"$corpus/predict_request/tsv${layout}"
done
# predict_request: rows as JSON objects, one per layout.
printf '\000{"rows": [{"I1": 3, "I2": "0.5", "C1": "68fd1e64", "C2": 12345, "C26": null}]}' \
    >"$corpus/predict_request/rows0"
printf '\001{"rows": [{"hour": 14102100, "site_id": "85f751fd", "device_ip": "c20a8177"}, {}]}' \
    >"$corpus/predict_request/rows1"
printf '\002{"rows": [{"price": 1.5, "user": "u1", "tags": ["a", "b", 7], "ad": "x"}]}' \
    >"$corpus/predict_request/rows2"
printf '\003{"rows": [{"user_id": "u3", "gender": "f", "item_id": "i9", "item_cat": "c1", "tags": [["t1", 0.5], "t2", ["t3", 2]], "hist_items": ["i1", "i2"], "price": 12.5}]}' \
    >"$corpus/predict_request/rows3"
printf '\004{"rows": [{"d0": 2, "d1": -1e3, "s0": "a", "seq": ["x", "y", "z", "w"]}]}' \
    >"$corpus/predict_request/rows4"
# checkpoint_files / export_files: each file, edit = patch (no patches: the valid file),
# whole file and enveloped payload.
for f in 0 1 2 3 4 5 6 7; do
    printf "$(printf '\\%03o' $((f + 32)))" >"$corpus/checkpoint_files/file${f}"
    printf "$(printf '\\%03o' $((f + 96)))" >"$corpus/checkpoint_files/payload${f}"
done
for t in 0 1 2 3; do
    for env in 0 16; do
        printf "$(printf '\\%03o' $((t + 8 + env)))\000\000\000" >"$corpus/export_files/t${t}-${env}"
    done
done
# ps_wire: one empty message of each type.
for pick in 0 1 2 3 4 5 6 7; do
    printf "$(printf '\\%03o' "$pick")" >"$corpus/ps_wire/empty${pick}"
done
# kafka_batches: answers built from batch specs (odd first byte), read from offset 0 with
# no end: plain lz4, transactional zstd + commit; gzip and snappy + abort; each codec alone.
printf '\001\000\000\000\000\000\000\002\003\000\001\001\004\001\002\000\000\001' \
    >"$corpus/kafka_batches/commit"
printf '\001\000\000\000\000\000\001\007\001\002\000\004\002\002\003\000\000\002' \
    >"$corpus/kafka_batches/abort"
for c in 0 1 2 3 4; do
    printf "\\001\\000\\000\\000\\000\\000\\000\\017$(printf '\\%03o' "$c")\\000" \
        >"$corpus/kafka_batches/codec${c}"
done
for t in "$corpus"/*; do
    echo "seeds: $(basename "$t"): $(ls "$t" | wc -l) files"
done
