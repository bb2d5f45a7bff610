#!/usr/bin/env bash
# Shows that the plan cache's memory is bounded: records 10,000 distinct shapes (a new
# plan each) in a release build and prints, every 1,000 shapes, the cache's estimated
# bytes against its limit and the process RSS (VmRSS). Run once with the default
# limit (64 MiB) and once with 8 MiB, where eviction starts early: after warm-up the
# cache stays under its limit and RSS stays flat.
# Usage: scripts/memory-bounds.sh [SHAPES]   (honours CARGO_TARGET_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPES="${1:-10000}"
cargo build --release --quiet --example plan_cache_growth
BIN="${CARGO_TARGET_DIR:-target}/release/examples/plan_cache_growth"
echo "== default limit =="
"$BIN" "$SHAPES"
echo "== limit 8 MiB =="
"$BIN" "$SHAPES" 8
