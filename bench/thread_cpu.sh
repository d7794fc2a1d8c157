#!/usr/bin/env bash
# BENCHMARKS.md "The sparse side per sample (issue 41, item 2)": CPU microseconds per sample of
# each thread group of `sparta train` (the table thread `sparta-sparse`, the readers
# `sparta-parse-*` / `-feed` / `-assemble`, the main thread, the dense threads `sparta-nn-*`),
# from `perf sched record` of whole runs, OLD and NEW binaries alternating, ROUNDS rounds.
# "non-GEMM" is everything but the dense threads: the issue's measure.
#
# Usage: OLD=old/sparta [NEW=target/release/sparta] [ROUNDS=3] [PEERS=/tmp/peers]
#        [TRAIN=$PEERS/data/train.tsv] [TEST=] [FLAGS="--precision f32"] [OUT=dir]
#        bench/thread_cpu.sh
# (data: the peers' 1M-row WDL set, `cd ../shared/peers && ./setup.sh data`; TEST empty: no
# test set, as the issue 19 fifth step's perf runs.) Needs `perf` with sched tracepoints.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
OLD=$(realpath "${OLD:?the release sparta binary before the change}")
NEW=$(realpath "${NEW:-$BENCH_ROOT/target/release/sparta}")
ROUNDS=${ROUNDS:-3}
PEERS=${PEERS:-${TMPDIR:-/tmp}/peers}
TRAIN=$(realpath "${TRAIN:-$PEERS/data/train.tsv}")
TEST=${TEST:-}
FLAGS=${FLAGS:---precision f32}
OUT=${OUT:-$(mktemp -d -t thread-cpu-XXXXXX)}
mkdir -p "$OUT"
machine
# The file in the page cache first: else the first run alone reads it from disk (feed thread).
cat "$TRAIN" >/dev/null
echo "round which samples/s auc | CPU-us per sample: sparse parse main nn | non-GEMM all/wall"
for round in $(seq 1 "$ROUNDS"); do
  for which in OLD NEW; do
    bin=${!which}
    test_args=()
    [ -n "$TEST" ] && test_args=(--test "$(realpath "$TEST")")
    # shellcheck disable=SC2086
    # (perf records every process: the run's threads are told apart by its pid, which `exec`
    # keeps.)
    perf sched record -o "$OUT/sched.data" -- bash -c 'echo $$ >"$0"; exec "$@"' "$OUT/pid" \
      "$bin" train --train "$TRAIN" "${test_args[@]}" $FLAGS --quiet \
      --summary-json "$OUT/s-$which-$round.json" >"$OUT/log-$which-$round" 2>&1
    rows=$(python3 -c "import json;print(json.load(open('$OUT/s-$which-$round.json'))['train_rows'])")
    perf sched timehist -i "$OUT/sched.data" -s 2>/dev/null >"$OUT/sched-$which-$round.txt"
    rm -f "$OUT/sched.data"
    cpu=$(python3 - "$OUT/sched-$which-$round.txt" "$rows" "$(cat "$OUT/pid")" <<'PY'
import re, sys
path, rows, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
groups = {"sparse": 0.0, "parse": 0.0, "main": 0.0, "nn": 0.0}
on = False
for line in open(path):
    if "Runtime summary" in line:
        on = True
        continue
    m = re.match(r"\s*(\S.*?)\[(\d+)(?:/(\d+))?\]\s+\d+\s+\d+\s+([\d.]+)", line) if on else None
    if not m:
        continue
    comm, ms = m.group(1), float(m.group(4))
    if (m.group(3) or m.group(2)) != pid:
        continue
    if comm.startswith("sparta-nn"):
        groups["nn"] += ms
    elif comm.startswith("sparta-sparse"):
        groups["sparse"] += ms
    elif comm.startswith(("sparta-parse", "sparta-feed", "sparta-assembl")):
        groups["parse"] += ms
    elif m.group(3) is None:
        # The main thread (its name is the binary's).
        groups["main"] += ms
us = {k: v * 1e3 / rows for k, v in groups.items()}
non = us["sparse"] + us["parse"] + us["main"]
print(f'{us["sparse"]:.2f} {us["parse"]:.2f} {us["main"]:.2f} {us["nn"]:.2f} | {non:.2f} '
      f'{sum(groups.values()) / 1e3:.2f}s')
PY
)
    wall=$(jget "$OUT/s-$which-$round.json" train_seconds)
    echo "$round $which $(jget "$OUT/s-$which-$round.json" train_samples_per_sec)" \
      "$(jget "$OUT/s-$which-$round.json" test_auc) | $cpu/${wall}s"
  done
done
echo "summaries and perf sched summaries in $OUT"
