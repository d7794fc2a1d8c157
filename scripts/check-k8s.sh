#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s): the example overlay is what deploy/k8s/generate.py
# writes; the base and the overlay render (`kubectl kustomize`) and validate against the API
# schemas of the oldest and the newest Kubernetes kubernetes-validate knows (--strict: an
# unknown field is an error); and scripts/check-k8s.py runs every container's command line
# through the real binary (`sparta --dry-run`, the job config read from the ConfigMap) and
# checks that the counts agree everywhere.
# SPARTA_BIN: the binary (default: target/debug/sparta, built when absent). kubectl must be
# on the PATH; kubernetes-validate (PyPI, pinned; PyYAML comes with it) is installed into a
# venv at target/k8s-venv when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
venv="${SPARTA_K8S_VENV:-${CARGO_TARGET_DIR:-$root/target}/k8s-venv}"
pin="kubernetes-validate==1.37.0"
# The oldest and the newest API versions the pinned kubernetes-validate carries.
versions=(1.25.0 1.37.0)
start=$(date +%s)
command -v kubectl >/dev/null || { echo "check-k8s: kubectl is not on the PATH" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
installed="$("$venv/bin/python" -m pip freeze --disable-pip-version-check)"
if ! grep -qix "$pin" <<<"$installed"; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$pin"
fi
if [ -z "${SPARTA_BIN:-}" ]; then
    cargo build -p sparta
    SPARTA_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/sparta"
fi
SPARTA_BIN="$(realpath "$SPARTA_BIN")"
py="$venv/bin/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$py" deploy/k8s/generate.py --check deploy/k8s/overlays/example
for dir in deploy/k8s/base deploy/k8s/overlays/example; do
    out="$tmp/$(basename "$dir").yaml"
    kubectl kustomize "$dir" >"$out"
    echo "== $dir: $(grep -c '^kind:' "$out") resources"
    for v in "${versions[@]}"; do
        "$venv/bin/kubernetes-validate" --strict --quiet -k "$v" "$out"
        echo "ok   kubernetes-validate --strict -k $v"
    done
    "$py" scripts/check-k8s.py "$SPARTA_BIN" "$out"
done
echo "check-k8s: all good in $(($(date +%s) - start)) s"
