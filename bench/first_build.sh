#!/usr/bin/env bash
# BENCHMARKS.md "The first build": a fresh clone of REPO at REV (default HEAD), empty target/,
# `cargo build --release --timings --bin sparta` timed by /usr/bin/time, then `sparta demo`
# timed; prints wall and user CPU and leaves the clone (its cargo-timings report) in OUT.
# Run on a quiet machine. Usage: [REPO=.] [REV=HEAD] OUT=/some/empty/folder bench/first_build.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPO=$(realpath "${REPO:-.}")
OUT=${OUT:?an empty folder for the clone}
git clone -q "$REPO" "$OUT"
cd "$OUT"
git checkout -q "${REV:-HEAD}"
machine
CARGO_INCREMENTAL=0 /usr/bin/time -f "build: %e s wall, %U s user, %S s system" \
  cargo build --release --timings --bin sparta 2>&1 | grep -E "^build:|Finished"
mkdir -p demo && cd demo
/usr/bin/time -f "demo: %e s wall" ../target/release/sparta demo 2>&1 | tail -n1
