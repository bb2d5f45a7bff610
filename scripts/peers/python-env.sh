# Shared by compare-peers.sh and compare-serving.sh (sourced, not run): the Python
# virtual environment under $PEERS/venv with the peers' packages, and the ONNX models
# exported once from $MODEL/model.safetensors into $PEERS/onnx. Expects PEERS, MODEL,
# SENTENCES, THREADS and OUT to be set and a `log` function; sets VENV, PY and ONNX.

# Creates the venv and installs torch, numpy, tokenizers, onnxruntime, onnx and openvino
# into it when they are missing.
python_env() {
    VENV=$PEERS/venv
    PY=$VENV/bin/python
    if [ ! -x "$PY" ]; then
        log "creating $VENV"
        python3 -m venv "$VENV"
    fi
    if ! "$PY" -c "import torch, numpy, tokenizers, onnxruntime, onnx, openvino" 2>/dev/null; then
        log "installing torch, numpy, tokenizers, onnxruntime, onnx, openvino from PyPI into $VENV (large download)"
        "$PY" -m pip install --quiet --disable-pip-version-check torch numpy tokenizers onnxruntime onnx \
            openvino >&2
    fi
}

# Exports the ONNX models (fp32, BERT-optimised, int8) with scripts/peers/ort_export.py,
# which redoes nothing that is up to date; its report goes to $OUT/export.txt. Exits
# the calling script when the export fails.
onnx_export() {
    ONNX=$PEERS/onnx
    log "ONNX models in $ONNX (exported once from $MODEL/model.safetensors)"
    if ! "$PY" scripts/peers/ort_export.py --model "$MODEL" --dir "$ONNX" --sentences "$SENTENCES" \
        --threads "$THREADS" > "$OUT/export.txt" 2>&1; then
        cat "$OUT/export.txt" >&2
        log "the ONNX export failed"
        exit 1
    fi
}
