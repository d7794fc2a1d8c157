#!/usr/bin/env bash
# The test command of the README: makes sure the test servers are installed
# (scripts/test-deps.sh), then runs every test of the workspace. Extra arguments go to
# `cargo test` (e.g. `scripts/test.sh -p sparta-data`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test-deps.sh
if [ "$#" -eq 0 ]; then
    set -- --workspace
fi
exec cargo test "$@"
