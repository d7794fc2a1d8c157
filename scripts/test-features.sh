# The features of the workspace's test build, in one place: scripts/test.sh builds with them,
# and CI's later `cargo test --workspace` steps pass the same ones, so they reuse that build (a
# different feature set recompiles every crate above the one it changes). Sourced, not run.
# The table benchmark's feature (its `dashmap`/`scc` baselines): its smoke test runs in the
# same build instead of a second one (a `-p sparta-table --features bench` build took ~95 s in
# CI).
test_features=(--features sparta-table/bench)
