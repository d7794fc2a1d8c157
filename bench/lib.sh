# Sourced by the bench/*.sh scripts: the repository root, the machine line every BENCHMARKS.md
# section names, a field of a JSON summary, a timed run of a command.
BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# machine: one line naming this machine (CPU model, cores, vector extensions), as BENCHMARKS.md
# sections record it.
machine() {
    local model cores isa=""
    model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
    cores=$(nproc)
    local flags
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
    for f in avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile; do
        case " $flags " in *" $f "*) isa="$isa $f" ;; esac
    done
    echo "machine: ${model:-unknown CPU}, $cores CPUs,${isa:- no AVX2}; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
}

# jget FILE PATH...: a field of a JSON file (dotted path; list indexes as numbers), '-' if absent.
jget() {
    python3 - "$@" <<'PY'
import json, sys
path, keys = sys.argv[1], sys.argv[2:]
try:
    v = json.load(open(path))
    for k in keys:
        for part in k.split("."):
            v = v[int(part)] if isinstance(v, list) else v[part]
    print(f"{v:.5f}" if isinstance(v, float) and abs(v) < 10 else (f"{v:,.0f}" if isinstance(v, float) else v))
except Exception:
    print("-")
PY
}

# timed LOG CMD...: runs CMD with stdout+stderr into LOG, sets WALL (seconds) and RC.
timed() {
    local log=$1 t0 t1
    shift
    t0=$(date +%s.%N)
    "$@" >"$log" 2>&1
    RC=$?
    t1=$(date +%s.%N)
    WALL=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
}
