# Sourced by scripts/chaos.sh and scripts/soak.sh (set ROWS, EPOCHS and NAME first): the
# binary, a work dir with generated train/test data, and the 2 PS + 2 worker sync job they
# fault.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SPARTA=${SPARTA:-$ROOT/target/release/sparta}
WORK=${WORK:-$(mktemp -d -t "sparta-$NAME-XXXXXX")}
[ -x "$SPARTA" ] || { echo "no $SPARTA: cargo build --release -p sparta (or set SPARTA)"; exit 2; }
mkdir -p "$WORK"
export RUST_LOG=warn
unset SPARTA_TOKEN

"$SPARTA" gen-data --rows "$ROWS" --seed 1 --vocab-scale 0.01 --out "$WORK/train.tsv" >/dev/null
"$SPARTA" gen-data --rows $((ROWS / 5)) --seed 2 --vocab-scale 0.01 --out "$WORK/test.tsv" >/dev/null
EXPECT=$((ROWS * EPOCHS))

# launch CKPT SUMMARY LOG EVERY RESTARTS: the job in the background, checkpointing every
# EVERY steps and recovering from at most RESTARTS process failures; sets LPID.
launch() {
    rm -rf "$1"
    "$SPARTA" launch --ps 2 --workers 2 --mode sync --model wdl --batch-size 256 \
        --epochs "$EPOCHS" --threads 1 --reader-threads 1 --seed 7 \
        --train "$WORK/train.tsv" --test "$WORK/test.tsv" --quiet \
        --checkpoint-dir "$1" --checkpoint-every-steps "$4" --max-restarts "$5" \
        --ps-retry-secs 30 --summary-json "$2" >"$3" 2>&1 &
    LPID=$!
}

# pid LOG NAME: the newest pid `sparta launch` printed for NAME (ps0, w1).
pid() { grep -o "launch: started $2 (pid [0-9]*" "$1" | tail -1 | grep -o '[0-9]*$'; }

# field JSON KEY: one field of a summary.
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))" "$1" "$2"; }
