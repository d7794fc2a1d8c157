#!/usr/bin/env bash
# WDL on the peers' 1M-row set, side by side and alternating: the strongest CPU peer (TF 2.21 +
# Keras 2, training loop alone on data in memory) and Sparta release binaries, round by round.
# Backs these BENCHMARKS.md sections ("Side by side, one run, alternating" tables):
#
#   pipeline   "Close to the machine (issue 19)": per round the peer, then `sparta train
#              --train train.tsv --test test.tsv` of PREV, of NEW, and of NEW with --exact;
#              3 rounds (was /tmp/side.sh, lost; reconstructed from the section's text)
#   pipeline600k  the same section's second pair: 600k rows (--max-rows 600000), no test set,
#              2 rounds, no peer: PREV, PREV --pipeline, NEW --exact, NEW (and NOPOP, the
#              binary without the populate change, when set)
#   bf16       "bf16 on AMX tiles (issue 19, second step)": per round the peer, then PREV, NEW
#              (f32, the default) and NEW --precision bf16; 3 rounds (was /tmp/side2.sh, lost;
#              reconstructed from the section's text)
#   quiet      "The loop's CPU budget on a quiet host (issue 19, fifth step)": per round the peer
#              with OMP_WAIT_POLICY=PASSIVE, then NEW --precision f32 and NEW --precision bf16;
#              3 rounds (the section gives these commands inline; no script was named)
#   nice       "The feeding threads' priority (issue 41)": per round the peer (f32,
#              OMP_WAIT_POLICY=PASSIVE), then PREV --precision f32 (before the change), NEW
#              --precision f32 and NEW --precision bf16; 3 rounds
#   bf16-peer  "bf16 without AMX (issue 41, item 4)": per round the peer in bf16 (Keras'
#              mixed_bfloat16, `--precision bf16`) with OMP_WAIT_POLICY=PASSIVE, then NEW
#              --precision f32 and NEW --precision bf16 (the kernel `bf16_kernel` picks; export
#              SPARTA_BF16_KERNEL to ask for one); 3 rounds
#
# Usage: [PREV=old/sparta] [NEW=target/release/sparta] [ROUNDS=3] [PEERS=/tmp/peers]
#        [PEER_DIR=../shared/peers] [PEER_VENV=venv-tfcpu] [NO_PEER=1] [MAX_ROWS=N]
#        [TRAIN=... TEST=...] [OUT=dir] [PEER_FLAGS="..."] bench/wdl_vs_peer_side_by_side.sh PRESET
#
# PEER_FLAGS: more flags for peer_tf.py (bf16-peer sets `--precision bf16`).
#
# Data: the peers' set, $PEERS/data/{train,test}.tsv (`cd ../shared/peers && ./setup.sh data tf`
# makes it and the peer's virtual environment; see ../shared/peers/README.md). TRAIN/TEST point
# elsewhere (e.g. a small `sparta gen-data` file for a smoke run; then NO_PEER=1, since the
# peer reads $PEERS/data). Samples/s are `train_samples_per_sec` of Sparta's --summary-json
# (training time, reading and parsing included) and the peer's `train_samples_per_s` (its
# training loop alone); "wall" is the whole process. Prints one line per run.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PRESET=${1:?usage: bench/wdl_vs_peer_side_by_side.sh pipeline|pipeline600k|bf16|quiet|bf16-peer}
NEW=$(realpath "${NEW:-$BENCH_ROOT/target/release/sparta}")
PREV=${PREV:-}
[ -n "$PREV" ] && PREV=$(realpath "$PREV")
NOPOP=${NOPOP:-}
export PEERS=${PEERS:-${TMPDIR:-/tmp}/peers}
PEER_DIR=$(realpath "${PEER_DIR:-$BENCH_ROOT/../shared/peers}")
PEER_VENV=${PEER_VENV:-venv-tfcpu}
TRAIN=$(realpath -m "${TRAIN:-$PEERS/data/train.tsv}")
TEST=$(realpath -m "${TEST:-$PEERS/data/test.tsv}")
OUT=${OUT:-$(mktemp -d -t wdl-side-XXXXXX)}
mkdir -p "$OUT"
NO_PEER=${NO_PEER:-}
PEER_ENV=""
PEER_FLAGS=${PEER_FLAGS:-}
PEER_LABEL=tf_keras2_mem
MAX_ROWS=${MAX_ROWS:-}

need_prev() { [ -n "$PREV" ] || { echo "PREV (the previous main's release binary) is needed for $PRESET" >&2; exit 2; }; }
case $PRESET in
pipeline) need_prev; ROUNDS=${ROUNDS:-3}; PEER_ENV=""
    RUNS=("prev|$PREV|" "new|$NEW|" "new-exact|$NEW|--exact") ;;
pipeline600k) need_prev; ROUNDS=${ROUNDS:-2}; NO_PEER=1; MAX_ROWS=${MAX_ROWS:-600000}; TEST=""
    RUNS=("prev|$PREV|" "prev-pipeline|$PREV|--pipeline" "new-exact|$NEW|--exact" "new|$NEW|")
    [ -n "$NOPOP" ] && RUNS+=("new-nopopulate|$(realpath "$NOPOP")|") ;;
bf16) need_prev; ROUNDS=${ROUNDS:-3}; PEER_ENV=""
    RUNS=("prev|$PREV|" "new-f32|$NEW|" "new-bf16|$NEW|--precision bf16") ;;
quiet) ROUNDS=${ROUNDS:-3}; PEER_ENV="OMP_WAIT_POLICY=PASSIVE"
    RUNS=("f32|$NEW|--precision f32" "bf16|$NEW|--precision bf16") ;;
nice) ROUNDS=${ROUNDS:-3}; PEER_ENV="OMP_WAIT_POLICY=PASSIVE"
    RUNS=("prev-f32|$PREV|--precision f32" "f32|$NEW|--precision f32" "bf16|$NEW|--precision bf16") ;;
bf16-peer) ROUNDS=${ROUNDS:-3}; PEER_ENV="OMP_WAIT_POLICY=PASSIVE"
    PEER_FLAGS=${PEER_FLAGS:---precision bf16}; PEER_LABEL=tf_keras2_mem_bf16
    RUNS=("f32|$NEW|--precision f32" "bf16|$NEW|--precision bf16") ;;
*) echo "unknown preset $PRESET" >&2; exit 2 ;;
esac

machine
echo "preset $PRESET, $ROUNDS rounds, train $TRAIN${TEST:+, test $TEST}${MAX_ROWS:+, --max-rows $MAX_ROWS}, out $OUT"
for round in $(seq 1 "$ROUNDS"); do
    if [ -z "$NO_PEER" ]; then
        # the peer, as ../shared/peers/README.md runs it; its JSON line goes to $PEERS/results.jsonl
        # shellcheck disable=SC2086
        timed "$OUT/peer-$round.log" env $PEER_ENV "$PEER_DIR/run_peer.sh" "$PEER_LABEL" "$PEER_VENV" \
            peer_tf.py --keras 2 --hash-in data --input memory $PEER_FLAGS
        tail -1 "$OUT/peer-$round.log" > "$OUT/peer-$round.json"
        echo "round $round peer: samples/s $(jget "$OUT/peer-$round.json" train_samples_per_s)" \
            "auc $(jget "$OUT/peer-$round.json" test_auc) parse $(jget "$OUT/peer-$round.json" parse_train_s) s" \
            "wall $(jget "$OUT/peer-$round.json" process_wall_s) s (rc $RC)"
    fi
    for run in "${RUNS[@]}"; do
        IFS='|' read -r name bin flags <<<"$run"
        s="$OUT/$name-$round.json"
        # shellcheck disable=SC2086
        timed "$OUT/$name-$round.log" "$bin" train --train "$TRAIN" ${TEST:+--test "$TEST"} \
            ${MAX_ROWS:+--max-rows "$MAX_ROWS"} $flags --quiet --summary-json "$s"
        echo "round $round $name: samples/s $(jget "$s" train_samples_per_sec)" \
            "loop $(jget "$s" loop_samples_per_sec) auc $(jget "$s" test_auc) wall ${WALL} s (rc $RC)"
    done
done
