#!/usr/bin/env bash
# Soak of bounded tables on a cluster (issue 36): a 2 PS + 2 worker `sparta launch --follow`
# over a generated stream of churning ids (16 of the 26 ids of every row are new, 10 recur),
# exports every 20 s served by `sparta serve`, for ${MINUTES:-20} minutes; every 30 s it
# samples the RSS of both PS processes, the served version and the served model's rows per
# table into WORKDIR/<run>/<run>.csv. Runs once with `eviction = { max_idle_steps = 50 }`
# (MAX_IDLE_STEPS) and once without (`RUNS="evict none"`, the default).
#
# usage: MINUTES=20 bench/soak_eviction.sh WORKDIR
#   SPARTA=path/to/sparta (default target/release/sparta), ROWS_PER_FILE (20000),
#   FILE_SECS (a file every 5 s), RUNS ("evict none"), PS_MEMORY_LIMIT (unset: no cap)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
S=${SPARTA:-$BENCH_ROOT/target/release/sparta}
W=$(mkdir -p "${1:?usage: bench/soak_eviction.sh WORKDIR}" && cd "$1" && pwd)
MINUTES=${MINUTES:-20}
ROWS_PER_FILE=${ROWS_PER_FILE:-20000}
FILE_SECS=${FILE_SECS:-5}
RUNS=${RUNS:-evict none}
export SPARTA_TOKEN=soak

# The stream: file N of ROWS_PER_FILE rows (Criteo layout) written as a dotfile and renamed.
ship() {
    python3 - "$1" "$2" "$ROWS_PER_FILE" <<'PY'
import os, random, sys
d, n, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(n)
tmp = os.path.join(d, f".part-{n:06d}.tsv")
with open(tmp, "w") as w:
    for r in range(rows):
        cols = [str(int(rnd.random() < 0.25))] + [str(rnd.randrange(50)) for _ in range(13)]
        for c in range(26):
            v = rnd.randrange(1000) if c < 10 else ((n * rows + r) << 5) | c
            cols.append("%08x" % (hash((v, c)) & 0xffffffff))
        w.write("\t".join(cols) + "\n")
os.rename(tmp, os.path.join(d, f"part-{n:06d}.tsv"))
PY
}

rss_kib() { awk '/^VmRSS/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

run() {
    local name=$1 d="$W/$1"
    rm -rf "$d"
    mkdir -p "$d/in" "$d/ex"
    local eviction=""
    [ "$name" = evict ] && eviction='[embedding]
eviction = { max_idle_steps = '"${MAX_IDLE_STEPS:-50}"' }'
    printf '[data]\nbatch_size = 1024\nreader_threads = 1\n[model]\nhidden = [64, 32]\n[train]\nthreads = 1\n%s\n' \
        "$eviction" >"$d/job.toml"
    ship "$d/in" 0
    local cap=()
    [ -n "${PS_MEMORY_LIMIT:-}" ] && cap=(--ps-memory-limit "$PS_MEMORY_LIMIT")
    "$S" launch --ps 2 --workers 2 --config "$d/job.toml" "${cap[@]}" \
        --follow "$d/in" --stop-file "$d/STOP" --follow-poll-secs 0.5 --follow-settle-secs 0 \
        --checkpoint-dir "$d/ckpt" --checkpoint-every-steps 20 --export-dir "$d/ex" \
        --export-every-secs 20 --quiet \
        --summary-json "$d/job.json" \
        >"$d/launch.log" 2>&1 &
    local launch=$!
    local ps0="" ps1=""
    while [ -z "$ps0" ] || [ -z "$ps1" ]; do
        sleep 0.2
        kill -0 "$launch" 2>/dev/null || { cat "$d/launch.log"; exit 1; }
        ps0=$(sed -n 's/.*launch: started ps0 (pid \([0-9]*\)).*/\1/p' "$d/launch.log" | tail -1)
        ps1=$(sed -n 's/.*launch: started ps1 (pid \([0-9]*\)).*/\1/p' "$d/launch.log" | tail -1)
    done
    # The shipper stops first (SHIP_END), then the job (STOP): every shipped file is trained.
    (n=1; while [ ! -e "$d/SHIP_END" ]; do ship "$d/in" $n; n=$((n + 1)); sleep "$FILE_SECS"; done) &
    local shipper=$!
    while [ -z "$(ls "$d/ex")" ]; do
        sleep 0.5
        kill -0 "$launch" 2>/dev/null || { cat "$d/launch.log"; exit 1; }
    done
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$S" serve --model "$d/ex" --listen "127.0.0.1:$port" --poll-ms 500 --insecure-no-auth \
        >"$d/serve.log" 2>&1 &
    local serve=$!
    echo "seconds,ps0_rss_mib,ps1_rss_mib,served_version,served_rows,rows_per_table" >"$d/$name.csv"
    local t0 end
    t0=$(date +%s)
    end=$((t0 + MINUTES * 60))
    while :; do
        local now m version rows tables
        now=$(date +%s)
        m=$(curl -s "127.0.0.1:$port/metrics" || true)
        version=$(echo "$m" | sed -n 's/^sparta_serve_model_version[{ ].* \([0-9.e+]*\)$/\1/p; s/^sparta_serve_model_version \([0-9.e+]*\)$/\1/p' | head -1)
        rows=$(echo "$m" | sed -n 's/^sparta_serve_model_rows[{ ].* \([0-9.e+]*\)$/\1/p; s/^sparta_serve_model_rows \([0-9.e+]*\)$/\1/p' | head -1)
        tables=$(echo "$m" | { grep '^sparta_serve_table_rows{' || true; } |
            sed 's/.*table="\([^"]*\)".* \([0-9.e+]*\)$/\1=\2/' | tr '\n' ' ')
        echo "$((now - t0)),$(($(rss_kib "$ps0") / 1024)),$(($(rss_kib "$ps1") / 1024)),${version:--},${rows:--},${tables:--}" >>"$d/$name.csv"
        [ "$now" -ge "$end" ] && break
        sleep 30
    done
    touch "$d/SHIP_END"
    wait "$shipper" || true
    touch "$d/STOP"
    wait "$launch" || echo "$name: launch failed (see $d/launch.log)"
    kill "$serve" 2>/dev/null || true
    wait "$serve" 2>/dev/null || true
    local shipped trained
    shipped=$(($(find "$d/in" -name 'part-*.tsv' | wc -l) * ROWS_PER_FILE))
    trained=$(jget "$d/job.json" samples_trained)
    echo "== $name: $d/$name.csv (evicted rows $(jget "$d/job.json" evicted_rows), samples trained $trained of $shipped shipped: $([ "$trained" = "$shipped" ] && echo exact || echo NOT EXACT))"
    cat "$d/$name.csv"
}

machine
for r in $RUNS; do run "$r"; done
