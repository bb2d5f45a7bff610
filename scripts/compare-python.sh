#!/usr/bin/env bash
# streamfuse's Python Embedder against sentence-transformers (PyTorch) and fastembed
# (ONNX Runtime), in one run (issue 33); not in CI: the first run downloads large
# packages from PyPI. Prints a markdown table (also written to
# target/compare-python/table.md): texts/s and p50/p99 per call at batch 32 and at one
# text a call, peak RSS, import to first embedding, min cosine to sentence-transformers.
# Each engine runs in a process of its own, the rounds alternate the engines, the
# table gives medians (bindings/python/bench/compare.py says exactly what is timed).
#
#   scripts/compare-python.sh [--rounds N]     (default 3)
#
# What it sets up, under target/compare-python:
#   venv/      sentence-transformers, fastembed and maturin from PyPI, and torch: from
#              PyPI (a large download: PyPI's Linux torch carries CUDA), or, when
#              TORCH_SITE names a site-packages folder that has torch (and onnx and
#              onnxruntime), that folder is put on the venv's path instead.
#   wheels/    streamfuse built by `maturin build --release` and installed into venv/.
#   onnx/      an ONNX export of the model's weights for fastembed
#              (bindings/python/bench/onnx_export.py; made once).
#   out/       the sorted corpus, each engine's vectors, table.md.
# Environment: STREAMFUSE_MODEL_DIR (the sentence-transformers folder; default
# target/models/all-MiniLM-L6-v2), SENTENCES (default scripts/data/sentences-512.txt),
# TORCH_SITE (above).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=3
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "unknown argument $1 (the one option is --rounds N)" >&2; exit 2 ;;
    esac
done
DIR=$ROOT/target/compare-python
VENV=$DIR/venv
PY=$VENV/bin/python
MODEL=${STREAMFUSE_MODEL_DIR:-$ROOT/target/models/all-MiniLM-L6-v2}
SENTENCES=${SENTENCES:-$ROOT/scripts/data/sentences-512.txt}
log() { echo "== $*" >&2; }
[ -f "$MODEL/model.safetensors" ] || { echo "no model folder at $MODEL (STREAMFUSE_MODEL_DIR)" >&2; exit 1; }

if [ ! -x "$PY" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
fi
if [ -n "${TORCH_SITE:-}" ]; then
    [ -d "$TORCH_SITE/torch" ] || { echo "TORCH_SITE=$TORCH_SITE has no torch" >&2; exit 1; }
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$TORCH_SITE" > "$site/_torch_site.pth"
    log "torch from $TORCH_SITE"
fi
if ! "$PY" -c "import torch, onnx, onnxruntime, sentence_transformers, fastembed, maturin" 2>/dev/null; then
    log "installing torch, onnx, sentence-transformers, fastembed and maturin into $VENV (large download)"
    "$PY" -m pip install --quiet --disable-pip-version-check torch onnx onnxruntime \
        sentence-transformers fastembed maturin >&2
fi

log "building streamfuse (maturin build --release)"
rm -rf "$DIR/wheels"
(cd bindings/python && "$VENV/bin/maturin" build --release --quiet -o "$DIR/wheels" >&2)
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    "$DIR"/wheels/streamfuse-*.whl >&2

log "ONNX export for fastembed"
"$PY" bindings/python/bench/onnx_export.py --model "$MODEL" --out "$DIR/onnx" >&2

mkdir -p "$DIR/out"
log "measuring ($ROUNDS rounds, engines alternated)"
"$PY" bindings/python/bench/compare.py --model "$MODEL" --onnx "$DIR/onnx" \
    --sentences "$SENTENCES" --out "$DIR/out" --rounds "$ROUNDS" | tee "$DIR/out/table.md"
