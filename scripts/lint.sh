#!/usr/bin/env bash
# The lints, as CI runs them before the tests (.ci/run): formatting, then clippy on
# every target with the default features, with none and with `internals` (the
# benches' raw kernels), and on the Python package
# (bindings/python), warnings as errors; then the crate's documentation, whose broken
# or private links are errors. The
# crate's own lint levels (src/lib.rs: missing_docs, unreachable_pub,
# unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks) are warnings while one
# works and errors here. scripts/test-aarch64.sh runs the same clippy for aarch64.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$component"
    fi
done
cargo fmt --all -- --check
cargo clippy --quiet --all-targets -- -D warnings
cargo clippy --quiet --all-targets --no-default-features -- -D warnings
# With `internals`: the benches that time raw kernels, and `unreachable_pub`, which
# holds only when `inspect::kernels` makes the raw kernels reachable (src/lib.rs).
cargo clippy --quiet --all-targets --features internals -- -D warnings
# The Python package's crate (a workspace member; the root's clippy covers the core
# crate only).
cargo clippy --quiet -p streamfuse-python --all-targets -- -D warnings
# The public documentation: every intra-doc link resolves, none to a private item.
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps
echo "== lints (fmt, clippy with default features, none and internals, and the Python package; rustdoc): $((SECONDS - start)) s"
