#!/usr/bin/env bash
# The Python package's tests, as CI runs them: a fresh venv (target/python-venv) with
# numpy, pytest and maturin from PyPI; the Rust reference (examples/python_reference.rs,
# which `cargo test` has built: finds or fetches all-MiniLM-L6-v2 as the examples do,
# and writes the Rust Embedder's and Reranker's outputs to target/python-ref); the
# package built into the venv by maturin in the dev profile (the profile `cargo test`
# builds, so most of the suite's dependencies are reused and the engine is not built
# at opt-level 3); then pytest on bindings/python/tests. Says how long each part took.
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/target/python-venv
ref=$root/target/python-ref
start=$SECONDS
python3 -m venv --clear "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check numpy pytest maturin
echo "== python venv (numpy, pytest, maturin): $((SECONDS - start)) s"

start=$SECONDS
mkdir -p "$ref"
head -n 96 scripts/data/sentences-512.txt > "$ref/sentences.txt"
# The reranker fixture's (query, document) pairs, one per line.
python3 - tests/data/tiny-reranker-reference.json > "$ref/pairs.tsv" <<'PY'
import json, sys
for q in json.load(open(sys.argv[1]))["queries"]:
    for p in q["pairs"]:
        print(f"{q['query']}\t{p['document']}")
PY
cargo run --quiet --example python_reference -- --out-dir "$ref" \
    --sentences "$ref/sentences.txt" \
    --reranker tests/data/tiny-reranker --pairs "$ref/pairs.tsv"
echo "== Rust reference outputs: $((SECONDS - start)) s"

start=$SECONDS
(cd bindings/python && VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH maturin develop --profile dev --quiet)
echo "== package built and installed (maturin develop --profile dev): $((SECONDS - start)) s"

start=$SECONDS
STREAMFUSE_PY_REF=$ref "$venv/bin/python" -m pytest bindings/python/tests -q "$@"
echo "== pytest: $((SECONDS - start)) s"
