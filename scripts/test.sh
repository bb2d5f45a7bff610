#!/usr/bin/env bash
# The test suite, as CI runs it: every test, then every test again with the portable
# loops forced (STREAMFUSE_PORTABLE=1 turns off each hand-written SIMD path: the packed
# f32/bf16/int8 tiles, the fused AVX programs, attention's AVX-512 block, the AVX-512
# GELU), so the paths other CPUs take are held to the same tests on a machine that has
# every feature.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test "$@"
echo "== again on the portable paths (STREAMFUSE_PORTABLE=1)"
STREAMFUSE_PORTABLE=1 cargo test "$@"
