#!/usr/bin/env bash
# The test suite, as CI runs it: every test on the best CPU tier this machine has, then
# again on each lower tier it has (STREAMFUSE_ISA=<tier>: avx512, avx2, ..., and
# portable, which turns off every hand-written SIMD path), so the paths other CPUs take
# are held to the same tests on whatever machine runs CI. `cargo run --example tiers`
# lists the tiers.
set -euo pipefail
cd "$(dirname "$0")/.."
tiers=$(cargo run --quiet --example tiers | sed 's/ \*$//')
best=$(echo "$tiers" | tail -n 1)
echo "== tiers here: $(echo $tiers); the suite on $best, then on each lower tier"
start=$SECONDS
cargo test "$@"
echo "== $best: $((SECONDS - start)) s"
for tier in $(echo "$tiers" | sed '$d' | tac); do
    start=$SECONDS
    echo "== again on tier $tier (STREAMFUSE_ISA=$tier)"
    STREAMFUSE_ISA=$tier cargo test "$@"
    echo "== $tier: $((SECONDS - start)) s"
done
