#!/usr/bin/env bash
# BENCHMARKS.md "The feeding threads' priority: f32 against the peer (issue 41)": samples/s,
# loss and each CPU's idle share of `sparta train` (WDL, f32, no test set) for each
# `[train] pipeline_nice` value in NICES, alternating, ROUNDS rounds; idle from
# `perf sched record` + `perf sched timehist -s` (needs perf with sched tracepoints; IDLE=0
# skips perf and times plain runs).
#
# Usage: [BIN=target/release/sparta] [NICES="0 5 10 15 19"] [ROUNDS=2] [IDLE=1]
#        [PEERS=/tmp/peers] [TRAIN=$PEERS/data/train.tsv] [OUT=dir] bench/pipeline_nice.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=$(realpath "${BIN:-$BENCH_ROOT/target/release/sparta}")
NICES=${NICES:-0 5 10 15 19}
ROUNDS=${ROUNDS:-2}
IDLE=${IDLE:-1}
PEERS=${PEERS:-${TMPDIR:-/tmp}/peers}
TRAIN=$(realpath "${TRAIN:-$PEERS/data/train.tsv}")
OUT=${OUT:-$(mktemp -d -t pipeline-nice-XXXXXX)}
mkdir -p "$OUT"
machine
cat "$TRAIN" >/dev/null
echo "round nice samples/s loss | idle CPU0 CPU1"
for round in $(seq 1 "$ROUNDS"); do
  for n in $NICES; do
    printf '[train]\npipeline_nice = %s\n' "$n" >"$OUT/nice-$n.toml"
    s="$OUT/s-$n-$round.json"
    run=("$BIN" train --config "$OUT/nice-$n.toml" --train "$TRAIN" --precision f32 --quiet
      --summary-json "$s")
    idle="-"
    if [ "$IDLE" = 1 ]; then
      perf sched record -o "$OUT/sched.data" -- "${run[@]}" >"$OUT/log-$n-$round" 2>&1
      idle=$(perf sched timehist -i "$OUT/sched.data" -s 2>/dev/null \
        | sed -n 's/.*idle for .*( *\([0-9.]*%\)).*/\1/p' | tr '\n' ' ')
      rm -f "$OUT/sched.data"
    else
      "${run[@]}" >"$OUT/log-$n-$round" 2>&1
    fi
    echo "$round $n $(jget "$s" train_samples_per_sec) $(jget "$s" train_loss) | $idle"
  done
done
echo "summaries in $OUT"
