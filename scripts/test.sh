#!/usr/bin/env bash
# The test suite, as CI runs it: every test on the best CPU tier this machine has, then
# again on lower tiers (STREAMFUSE_ISA=<tier>), so the paths other CPUs take are held to
# the same tests on whatever machine runs CI. `cargo run --example tiers` lists the
# tiers.
#
# The whole suite runs on the best tier and on `avx2` (the tier most x86 machines in
# use have). Every other tier (`portable`, with no hand-written SIMD, and on an AMX
# machine avx2-vnni, avx512, avx512-vnni) runs the tests whose code depends on the
# tier: the library's unit tests (every kernel and its dispatch) and the integration
# tests that run kernels end to end (LOWER_TIER_TESTS), so that CI, which runs the
# aarch64 suite under emulation after this, stays inside its time. STREAMFUSE_FULL_TIERS=1 runs the whole suite on every
# tier. Arguments go to every `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
LOWER_TIER_TESTS=(--lib --test attention --test precision --test minilm --test ops --test fusion --test alloc)
tiers=$(cargo run --quiet --example tiers | sed 's/ \*$//')
best=$(echo "$tiers" | tail -n 1)
echo "== tiers here: $(echo $tiers); the suite on $best, then on each lower tier"
start=$SECONDS
cargo test "$@"
echo "== $best: $((SECONDS - start)) s"
for tier in $(echo "$tiers" | sed '$d' | tac); do
    start=$SECONDS
    case "$tier:${STREAMFUSE_FULL_TIERS:-0}" in
    avx2:* | *:1)
        echo "== again on tier $tier (STREAMFUSE_ISA=$tier), the whole suite"
        STREAMFUSE_ISA=$tier cargo test "$@"
        ;;
    *)
        echo "== again on tier $tier (STREAMFUSE_ISA=$tier): ${LOWER_TIER_TESTS[*]}"
        STREAMFUSE_ISA=$tier cargo test "${LOWER_TIER_TESTS[@]}" "$@"
        ;;
    esac
    echo "== $tier: $((SECONDS - start)) s"
done
