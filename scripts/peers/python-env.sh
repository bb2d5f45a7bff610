# Shared by compare-peers.sh, compare-serving.sh and compare-shared.sh (sourced, not
# run): the Python virtual environment under $PEERS/venv with the peers' packages, the
# ONNX models exported once from $MODEL/model.safetensors into $PEERS/onnx, and MKL's
# vendor shim. Expects PEERS, MODEL, SENTENCES, THREADS and OUT to be set and a `log`
# function; sets VENV, PY, ONNX and SHIM.

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

# Sets SHIM to a library that answers MKL's vendor check (`mkl_serv_intel_cpu_true`) as
# Intel, preloaded into PyTorch on other vendors' CPUs so that MKL takes its AVX2 and
# AVX-512 paths there, as a knowledgeable user does; empty on Intel CPUs or without a
# C compiler.
mkl_shim() {
    SHIM=""
    if ! grep -q GenuineIntel /proc/cpuinfo && command -v cc >/dev/null; then
        echo 'int mkl_serv_intel_cpu_true(void) { return 1; }' > "$PEERS/mkl_shim.c"
        cc -shared -fPIC -O2 -o "$PEERS/libmkl_shim.so" "$PEERS/mkl_shim.c"
        SHIM=$PEERS/libmkl_shim.so
    fi
}
