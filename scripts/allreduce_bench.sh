#!/usr/bin/env bash
# Dense all-reduce figures of BENCHMARKS.md: dense bytes per sample per worker and samples/s of
# a 2 PS job in PS sync mode against dense mode allreduce (f32 and fp16 on the ring), with 2, 3
# and 4 workers. Each process runs in its own network namespace behind a veth pair on one
# bridge, every link shaped with `tc tbf` to RATE each way (loopback hides bandwidth), or on
# plain loopback with RATE=none. Needs root (ip netns, tc).
# Usage: scripts/allreduce_bench.sh [SPARTA_BIN] [ROWS] [RATE] [WORKER_COUNTS]
#   e.g. scripts/allreduce_bench.sh target/release/sparta 100000 1gbit "2 3 4"
set -euo pipefail
S=$(realpath "${1:-target/release/sparta}")
ROWS=${2:-100000}
RATE=${3:-1gbit}
COUNTS=${4:-2 3 4}
W=$(mktemp -d)
# Fresh names for every run: deleting a namespace tears its veth pair down asynchronously.
R=0
BR=spbr0
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ "$RATE" != none ]; then
        for ns in $(ip netns list | awk '/^sp-/{print $1}'); do ip netns del "$ns" 2>/dev/null || true; done
        for br in $(ip -o link show type bridge | awk -F': ' '/spbr/{print $2}'); do ip link del "$br" || true; done
    fi
    rm -rf "$W"
}
trap cleanup EXIT
export SPARTA_TOKEN=bench-token
"$S" gen-data --rows "$ROWS" --out "$W/train.tsv" >/dev/null
TRAIN=(--batch-size 256 --threads 1 --reader-threads 1 --seed 7 --quiet)

# host NAME INDEX: a namespace sp-NAME with address 10.77.0.INDEX behind a shaped veth.
host() {
    local ns=sp-$R-$1 ip=10.77.0.$2 v=v${R}x$2 b=b${R}x$2
    ip netns add "$ns"
    ip link add "$v" type veth peer name "$b"
    ip link set "$v" netns "$ns"
    ip link set "$b" master "$BR" up
    ip netns exec "$ns" ip addr add "$ip/24" dev "$v"
    ip netns exec "$ns" ip link set "$v" up
    ip netns exec "$ns" ip link set lo up
    # Egress of the host and egress of its bridge port (= the host's ingress): RATE each way.
    ip netns exec "$ns" tc qdisc add dev "$v" root tbf rate "$RATE" burst 512kb latency 100ms
    tc qdisc add dev "$b" root tbf rate "$RATE" burst 512kb latency 100ms
}

# run WORKERS MODE RING_COMPRESSION: one job; prints its line.
run() {
    local m=$1 mode=$2 comp=$3 ps_addrs ring_addrs="" i
    local ps_mode=$mode exec_ps exec_w
    R=$((R + 1))
    if [ "$RATE" != none ]; then
        BR=spbr$R
        ip link add "$BR" type bridge && ip link set "$BR" up
        host ps0 1; host ps1 2
        for ((i = 0; i < m; i++)); do host "w$i" $((10 + i)); done
        ps_addrs=10.77.0.1:7070,10.77.0.2:7070
        for ((i = 0; i < m; i++)); do ring_addrs+="${ring_addrs:+,}10.77.0.$((10 + i)):7071"; done
    else
        ps_addrs=127.0.0.1:17070,127.0.0.1:17071
        for ((i = 0; i < m; i++)); do ring_addrs+="${ring_addrs:+,}127.0.0.1:$((17100 + i))"; done
    fi
    PIDS=()
    for i in 0 1; do
        local listen=${ps_addrs//,/ }; listen=$(echo $listen | cut -d' ' -f$((i + 1)))
        if [ "$RATE" != none ]; then exec_ps=(ip netns exec "sp-$R-ps$i"); else exec_ps=(); fi
        "${exec_ps[@]}" "$S" ps --shard $i --num-shards 2 --workers "$m" --mode "$ps_mode" \
            --listen "$listen" >"$W/ps$i.log" 2>&1 &
        PIDS+=($!)
    done
    for i in 0 1; do until grep -q "listening on" "$W/ps$i.log"; do sleep 0.05; done; done
    local extra=()
    if [ "$mode" = allreduce ]; then extra=(--ring "$ring_addrs" --ring-compression "$comp"); fi
    local wp=()
    for ((i = 0; i < m; i++)); do
        if [ "$RATE" != none ]; then exec_w=(ip netns exec "sp-$R-w$i"); else exec_w=(); fi
        "${exec_w[@]}" "$S" worker --rank $i --num-workers "$m" --ps "$ps_addrs" "${extra[@]}" \
            "${TRAIN[@]}" --train "$W/train.tsv" --summary-json "$W/w$i.json" >"$W/w$i.log" 2>&1 &
        wp+=($!)
    done
    for p in "${wp[@]}"; do wait "$p" || { cat "$W"/w*.log; exit 1; }; done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    PIDS=()
    python3 - "$m" "$mode${comp:+ $comp}" "$W" <<'PY'
import json, sys
m, mode, w = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ws = [json.load(open(f"{w}/w{i}.json")) for i in range(m)]
rows = sum(x["train_rows"] for x in ws)
secs = max(x["train_seconds"] for x in ws)
dense = ws[0]["wire"]["dense_bytes_per_sample"]
sparse = ws[0]["wire"]["sparse_bytes_per_sample"]
print(f"| {m} | {mode} | {dense:.0f} | {sparse:.0f} | {rows / secs:.0f} |")
PY
    if [ "$RATE" != none ]; then
        for ns in $(ip netns list | awk '/^sp-/{print $1}'); do ip netns del "$ns"; done
        ip link del "$BR"
    fi
}

echo "rate $RATE, $ROWS rows, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "| workers | dense mode | dense bytes/sample/worker | sparse bytes/sample/worker | samples/s |"
echo "| --- | --- | --- | --- | --- |"
for m in $COUNTS; do
    run "$m" sync ""
    run "$m" allreduce none
    run "$m" allreduce fp16
done
