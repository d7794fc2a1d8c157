#!/usr/bin/env bash
# The test command of the README: makes sure the test servers are installed
# (scripts/test-deps.sh), then runs every test of the workspace and, then, the Python
# package's (scripts/test-python.sh). Extra arguments go to `cargo test` alone (e.g.
# `scripts/test.sh -p sparta-data`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test-deps.sh
if [ "$#" -gt 0 ]; then
    exec cargo test "$@"
fi
source scripts/test-features.sh
cargo test --workspace "${test_features[@]}"
# The binary the process tests just ran (fresh): no second build of it.
SPARTA_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/sparta" scripts/test-python.sh
