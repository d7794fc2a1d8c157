#!/usr/bin/env bash
# `sparta bench train` (every model's dense step alone on 1 and 2 threads, and the whole training
# loop, on generated data) of two release binaries, alternated round by round, in f32 and bf16.
# Backs these BENCHMARKS.md sections:
#
#   "Fused epilogues and fewer passes (issue 19, third step)", its "Side by side, alternating"
#     table: per round and precision `sparta bench train --rows 200000 --test-rows 40000
#     --precision P` of the before binary and of the branch's, order swapped in round 2
#     (was /tmp/fuse/side/side.sh, lost; reconstructed from the section's text):
#       BEFORE=old/sparta AFTER=new/sparta bench/bench_train_alternating.sh
#     and its quicker alternations (wdl f32, `--rows 20000 --iters 30`, three pairs):
#       BEFORE=... AFTER=... MODELS=wdl PRECISIONS=f32 ROWS=20000 TEST_ROWS= ITERS=30 ROUNDS=3 SWAP=0 \
#         bench/bench_train_alternating.sh
#   "A quiet machine, every model's thread scaling (issue 19, fourth step)": `sparta bench train
#     --rows 40000 --test-rows 4000 --iters 30 --precision P`, every model (was /tmp/q/ab.sh,
#     lost; reconstructed from the section's text):
#       AFTER=target/release/sparta ROWS=40000 TEST_ROWS=4000 ITERS=30 ROUNDS=1 bench/bench_train_alternating.sh
#     and its reverted attempt, alternating with main's binary (dlrm, f32, --iters 40, three pairs):
#       BEFORE=main/sparta AFTER=change/sparta MODELS=dlrm PRECISIONS=f32 ROWS=40000 TEST_ROWS=4000 \
#         ITERS=40 ROUNDS=3 SWAP=0 bench/bench_train_alternating.sh
#
# Environment: AFTER (default target/release/sparta), BEFORE (optional: without it only AFTER
# runs), ROUNDS (2), SWAP (1: even rounds run AFTER first), PRECISIONS ("f32 bf16"), MODELS
# (empty: every model), ROWS (200000), TEST_ROWS (40000; empty: the command's default), ITERS
# (empty: the command's default, 10), OUT (a temporary folder). Prints the GEMM peaks and, per
# model, "dense step 1 thread / N threads / loop samples/s, test AUC" for every run; the JSON
# of each run stays in OUT.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
AFTER=$(realpath "${AFTER:-$BENCH_ROOT/target/release/sparta}")
BEFORE=${BEFORE:-}
[ -n "$BEFORE" ] && BEFORE=$(realpath "$BEFORE")
ROUNDS=${ROUNDS:-2}
SWAP=${SWAP:-1}
PRECISIONS=${PRECISIONS:-f32 bf16}
MODELS=${MODELS:-}
ROWS=${ROWS:-200000}
TEST_ROWS=${TEST_ROWS-40000}
ITERS=${ITERS:-}
OUT=${OUT:-$(mktemp -d -t bench-train-XXXXXX)}
mkdir -p "$OUT"

report() { # JSON
    python3 - "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
peaks = ", ".join(f"{p['gflops']:.1f} GFLOP/s on {p['threads']}" for p in j.get("gemm_peak", []))
print(f"  gemm peak: {peaks}; bf16 tiles: {j.get('bf16_tiles')}; bf16 kernel: {j.get('bf16_kernel')}")
for m in j["models"]:
    d, l = m["dense_step"], m["training_loop"]
    flat = {}
    for k, v in (m.get("test") or {}).items():
        if isinstance(v, dict):
            flat.update({f"{k}.{a}": b for a, b in v.items()})
        else:
            flat[k] = v
    auc = ", ".join(f"{k} {v:.4f}" for k, v in flat.items() if isinstance(v, float) and k.endswith("auc")) or "-"
    print(f"  {m['model']:7} dense 1 thread {d['threads_1']['samples_per_sec']/1e3:.1f}k"
          f" / {d['threads_n']['threads']} threads {d['threads_n']['samples_per_sec']/1e3:.1f}k"
          f" ({d['speedup_n_over_1']:.2f}x) / loop {l['samples_per_sec']/1e3:.1f}k; test {auc}")
PY
}

one() { # label binary precision round
    local j="$OUT/$1-$3-$4.json"
    # shellcheck disable=SC2086
    nice -n "${NICE:-0}" "$2" bench train --rows "$ROWS" ${TEST_ROWS:+--test-rows "$TEST_ROWS"} \
        ${ITERS:+--iters "$ITERS"} ${MODELS:+--models "$MODELS"} --precision "$3" \
        --out "$j" >/dev/null 2>"$OUT/$1-$3-$4.log"
    echo "round $4 $3 $1 (rc $?, $(date -u +%T)):"
    report "$j"
}

machine
echo "rows $ROWS, test rows ${TEST_ROWS:-default}, iters ${ITERS:-default}, models ${MODELS:-all}, out $OUT"
for round in $(seq 1 "$ROUNDS"); do
    for p in $PRECISIONS; do
        if [ -z "$BEFORE" ]; then
            one after "$AFTER" "$p" "$round"
        elif [ "$SWAP" = 1 ] && [ $((round % 2)) = 0 ]; then
            one after "$AFTER" "$p" "$round"; one before "$BEFORE" "$p" "$round"
        else
            one before "$BEFORE" "$p" "$round"; one after "$AFTER" "$p" "$round"
        fi
    done
done
