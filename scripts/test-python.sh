#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest): a venv with pinned packages from PyPI,
# `maturin develop` (debug profile, the workspace's target/; it builds the crates under the
# package with the package's own feature set, so after `cargo test --workspace` most of them
# compile again: ~3.5 min in CI) and the `sparta` binary the tests make their data with
# (SPARTA_BIN).
# Run by scripts/test.sh after `cargo test --workspace`; alone: scripts/test-python.sh
# [pytest args]. The venv lives in target/py-venv (PYTHON picks the interpreter, >= 3.9).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
venv="${SPARTA_PY_VENV:-$root/target/py-venv}"
py="${PYTHON:-python3}"
pins=(maturin==1.9.6 pytest==9.2.0 numpy==2.4.6 pandas==3.1.1 pyarrow==26.0.1 tensorboard==2.21.0 prometheus_client==0.23.1)
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
# Installs only what is missing or at another version (fast when warm).
lower() { tr '[:upper:]' '[:lower:]' | sort; }
missing="$(comm -23 <(printf '%s\n' "${pins[@]}" | lower) \
    <("$venv/bin/python" -m pip freeze --disable-pip-version-check | lower))"
if [ -n "$missing" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
if [ -z "${SPARTA_BIN:-}" ]; then
    cargo build -p sparta
    SPARTA_BIN="$CARGO_TARGET_DIR/debug/sparta"
fi
export SPARTA_BIN
(cd python && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --quiet)
exec "$venv/bin/python" -m pytest -q python/tests "$@"
