#!/usr/bin/env bash
# all-MiniLM-L6-v2 sentence embeddings: streamfuse against PyTorch, ONNX Runtime (fp32
# and dynamically quantised int8) and candle, side by side in one run, on the same
# sentences (scripts/data/sentences-512.txt: 512 sentences of 6-40 words). Two sections:
#
#   batch BATCH (32)  throughput: sentences/s, latency of one batch, peak RSS, CPU time
#   batch 1           one sentence a call, one call at a time: latency p50/p99 per
#                     sentence; streamfuse with 1 stream and with THREADS streams
#
# Every peer gets the same length-sorted batches, as sentence-transformers' encode()
# makes them: sentences sorted by token length (longest first, ties in input order),
# neighbours batched, each batch padded to its own longest (streamfuse runs the same
# batches ragged, its sentences' tokens packed with no padding, as its Embedder does;
# `minilm --padded` would pad them too). Every peer returns the
# mean-pooled, L2-normalised embedding; the table gives each row's smallest cosine to
# streamfuse's (--threads 1) embeddings of the same section. The same run measures the
# machine's f32 matmul GFLOP/s (1 and THREADS threads, before each repetition; the
# best kept) and from it an upper bound on sentences/s: the corpus's unpadded FLOPs at
# the best THREADS-thread rate.
#
#   scripts/compare-peers.sh                 # both sections, REPEAT=3 runs of each row
#   REPEAT=5 BATCH=32 THREADS=2 SENTENCES=file.txt scripts/compare-peers.sh
#   MODE=batch scripts/compare-peers.sh      # only the batch-BATCH section
#   MODE=latency scripts/compare-peers.sh    # only the batch-1 section
#   MODE=setup scripts/compare-peers.sh      # install, build and export; run nothing
#
# Knobs: REPEAT (runs of each row; the table gives the median sentences/s, p50, p99 and
# CPU time, and the largest peak RSS), BATCH, THREADS (each peer's thread count: torch
# intra-op threads, ONNX Runtime intra_op_num_threads, candle's rayon threads,
# streamfuse --threads), SENTENCES, MODE, STREAMFUSE_MODEL_DIR (the model folder;
# default target/models/all-MiniLM-L6-v2), CARGO_TARGET_DIR (where streamfuse builds).
#
# Installs what it needs under target/peers/ by itself: a Python virtual environment
# (venv/) with torch (PyPI's wheel; large), numpy, tokenizers, onnxruntime and onnx;
# candle (crates.io) built as a separate cargo project candle-bench/, outside
# streamfuse's build; the ONNX models in onnx/, exported from the same
# model.safetensors by scripts/peers/ort_export.py once (redone when the model, the
# export script or the package versions change). Not part of CI.
#
# On a CPU with AMX, PyTorch has a second row with its fp32 products run through oneDNN
# in bf16 (torch.backends.mkldnn.matmul.fp32_precision = "bf16"): not an fp32 peer, but
# what a PyTorch user who trades accuracy for speed there gets; its "min cos vs sf"
# shows the accuracy it trades.
#
# PyTorch's x86 wheels use Intel MKL, whose sgemm may take a slower path on CPUs that
# do not report GenuineIntel. On such a CPU the table has a second PyTorch row with
# MKL's vendor check answered "Intel" by a preloaded shim (a one-line C function built
# here with cc), which is what a user who knows the trick gets.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PEERS=$ROOT/target/peers
OUT=$PEERS/out
REPEAT=${REPEAT:-3}
BATCH=${BATCH:-32}
THREADS=${THREADS:-2}
MODE=${MODE:-all}
SENTENCES=${SENTENCES:-$ROOT/scripts/data/sentences-512.txt}
MODEL=${STREAMFUSE_MODEL_DIR:-$ROOT/target/models/all-MiniLM-L6-v2}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case $MODE in all | batch | latency | setup) ;; *)
    echo "MODE must be all, batch, latency or setup (got $MODE)" >&2
    exit 2
    ;;
esac
mkdir -p "$OUT"
log() { echo "== $*" >&2; }
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

# --- inputs -----------------------------------------------------------------------
[ -f "$SENTENCES" ] || python3 scripts/gen_sentences.py > "$SENTENCES"
log "building streamfuse (release)"
cargo build --release --example minilm >&2
SF=$TARGET_DIR/release/examples/minilm
if [ ! -f "$MODEL/model.safetensors" ]; then
    log "fetching the model into $MODEL"
    "$SF" --model "$MODEL" >&2
fi

# --- Python: PyTorch, ONNX Runtime ---------------------------------------------------
# shellcheck source=scripts/peers/python-env.sh
. scripts/peers/python-env.sh
python_env
SHIM=""
if ! grep -q GenuineIntel /proc/cpuinfo && command -v cc >/dev/null; then
    echo 'int mkl_serv_intel_cpu_true(void) { return 1; }' > "$PEERS/mkl_shim.c"
    cc -shared -fPIC -O2 -o "$PEERS/libmkl_shim.so" "$PEERS/mkl_shim.c"
    SHIM=$PEERS/libmkl_shim.so
fi
onnx_export
sed 's/^/    /' "$OUT/export.txt" >&2

# --- candle ---------------------------------------------------------------------------
CANDLE=$PEERS/candle-bench
mkdir -p "$CANDLE/src"
cat > "$CANDLE/Cargo.toml" <<'EOF'
[package]
name = "candle-bench"
version = "0.0.0"
edition = "2021"
publish = false

# A project of its own: not a member of streamfuse's workspace.
[workspace]

[dependencies]
candle-core = "0.11"
candle-nn = "0.11"
candle-transformers = "0.11"
tokenizers = { version = "0.22", default-features = false, features = ["fancy-regex"] }
serde_json = "1"

[profile.release]
debug = 1
EOF
cmp -s scripts/peers/candle_bench.rs "$CANDLE/src/main.rs" || cp scripts/peers/candle_bench.rs "$CANDLE/src/main.rs"
log "building candle-bench (release)"
CARGO_TARGET_DIR=$CANDLE/target cargo build --release --quiet --manifest-path "$CANDLE/Cargo.toml" >&2
CANDLE_BIN=$CANDLE/target/release/candle-bench
CANDLE_VERSION=$(awk '/^name = "candle-core"/ { getline; gsub(/"/, "", $3); print $3 }' "$CANDLE/Cargo.lock")

[ "$MODE" = setup ] && { log "set up; MODE=setup runs nothing"; exit 0; }

# --- the machine's matmul rate ----------------------------------------------------------
# Measured before each repetition of the rows, so that one burst of other work on the
# machine does not set the limit; the table keeps the best of the measurements.
GEMM=$OUT/gemm.txt
: > "$GEMM"
GEMM_THREADS=1
[ "$THREADS" != 1 ] && GEMM_THREADS="1 $THREADS"
measure_gemm() {
    log "matmul GFLOP/s (torch/MKL${SHIM:+ with the shim}, numpy/OpenBLAS; threads: $GEMM_THREADS)"
    local before
    before=$(wc -l < "$GEMM")
    # shellcheck disable=SC2086
    env ${SHIM:+LD_PRELOAD=$SHIM} "$PY" scripts/peers/roofline.py gemm --lib torch \
        --threads $GEMM_THREADS >> "$GEMM" </dev/null
    for t in $GEMM_THREADS; do
        OPENBLAS_NUM_THREADS=$t "$PY" scripts/peers/roofline.py gemm --lib numpy --threads "$t" \
            >> "$GEMM" </dev/null
    done
    tail -n +"$((before + 1))" "$GEMM" | sed 's/^/    /' >&2
}

# --- rows -----------------------------------------------------------------------------
# A row: section (the batch size), a role (what the table compares it with), a name,
# and a command (run through env, so variables can lead; OUT is the embeddings file).
ROWS=$OUT/rows.tsv
: > "$ROWS"
CMDS=()
add() {
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${#CMDS[@]}" >> "$ROWS"
    CMDS+=("$4")
}
rows_for() { # batch
    local b=$1 common="--model $MODEL --sentences $SENTENCES --batch $1"
    add "$b" torch "pytorch ($THREADS threads)" \
        "$PY scripts/peers/torch_bench.py $common --threads $THREADS --out OUT"
    if [ -n "$SHIM" ]; then
        add "$b" torch "pytorch + MKL Intel shim" \
            "LD_PRELOAD=$SHIM $PY scripts/peers/torch_bench.py $common --threads $THREADS --out OUT"
    fi
    if grep -qw amx_bf16 /proc/cpuinfo; then
        # Not an fp32 peer (its products are bf16): the row a PyTorch user on an AMX
        # CPU gets by trading accuracy for speed, beside streamfuse's bf16x3 and bf16.
        add "$b" torch-bf16 "pytorch, AMX bf16 matmuls" \
            "$PY scripts/peers/torch_bench.py $common --threads $THREADS --fp32-precision bf16 --out OUT"
    fi
    add "$b" ort-fp32 "onnxruntime fp32 ($THREADS threads)" \
        "$PY scripts/peers/ort_bench.py --onnx $ONNX/minilm-fp32-opt.onnx $common --threads $THREADS --out OUT"
    add "$b" ort-int8 "onnxruntime int8 ($THREADS threads)" \
        "$PY scripts/peers/ort_bench.py --onnx $ONNX/minilm-int8.onnx $common --threads $THREADS --out OUT"
    add "$b" ort-int8 "onnxruntime int8 per-channel" \
        "$PY scripts/peers/ort_bench.py --onnx $ONNX/minilm-int8-pc.onnx $common --threads $THREADS --out OUT"
    add "$b" candle "candle $CANDLE_VERSION ($THREADS threads)" \
        "RAYON_NUM_THREADS=$THREADS $CANDLE_BIN $MODEL $SENTENCES $b OUT"
    if [ "$b" = 1 ]; then
        add "$b" sf-ref "streamfuse 1 stream (--threads 1)" "$SF $common --threads 1 --out OUT"
        [ "$THREADS" != 1 ] && add "$b" sf "streamfuse $THREADS streams (--threads $THREADS)" \
            "$SF $common --threads $THREADS --out OUT"
        for p in bf16x3 bf16 int8; do
            add "$b" "sf-$p" "streamfuse $p 1 stream" \
                "$SF $common --threads 1 --precision $p --out OUT"
        done
    else
        add "$b" sf-ref "streamfuse --threads 1" "$SF $common --threads 1 --out OUT"
        [ "$THREADS" != 1 ] && add "$b" sf "streamfuse --threads $THREADS" \
            "$SF $common --threads $THREADS --out OUT"
        for p in bf16x3 bf16 int8; do
            add "$b" "sf-$p" "streamfuse $p --threads $THREADS" \
                "$SF $common --threads $THREADS --precision $p --out OUT"
        done
    fi
    return 0
}
[ "$MODE" != latency ] && rows_for "$BATCH"
[ "$MODE" != batch ] && rows_for 1

# --- runs -----------------------------------------------------------------------------
# Rows take turns within each repetition, so a burst of other work on the machine falls
# on several rows rather than all runs of one.
RESULTS=$OUT/results.tsv
: > "$RESULTS"
have_time=0
[ -x /usr/bin/time ] && have_time=1
failed=0
for r in $(seq 1 "$REPEAT"); do
    measure_gemm
    while IFS=$'\t' read -r section role name i; do
        emb=$OUT/row$i.bin
        cmd=${CMDS[$i]//OUT/$emb}
        log "run $r/$REPEAT, batch $section: $name"
        status=ok
        if [ $have_time = 1 ]; then
            text=$(eval "/usr/bin/time -v env $cmd" 2>"$OUT/stderr$i.txt" </dev/null) || status=failed
            kib=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$OUT/stderr$i.txt")
            mib=$(awk -v k="${kib:-0}" 'BEGIN { printf "%.0f", k / 1024 }')
        else
            text=$(eval "env $cmd" 2>"$OUT/stderr$i.txt" </dev/null) || status=failed
            mib=$(echo "$text" | awk '/^peak RSS:/ { printf "%.0f", $3 }')
        fi
        echo "$text" | sed 's/^/    /' >&2
        if [ $status != ok ]; then
            failed=1
            log "FAILED: $name; its stderr ends:"
            tail -n 20 "$OUT/stderr$i.txt" | sed 's/^/    /' >&2
        fi
        field() { echo "$text" | awk -v k="$1" '$1 == k { print $2 }'; }
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$section" "$i" "$r" "$status" \
            "$(field sentences/s:)" "$(field cpu:)" "${mib:-}" "$(field p50_ms:)" \
            "$(field p99_ms:)" >> "$RESULTS"
    done < "$ROWS"
done

# --- the FLOP bound and the table -----------------------------------------------------
BEST_GFLOPS=$(awk -v t="$THREADS" '$3 == t && $5 > b { b = $5 } END { print b + 0 }' "$GEMM")
"$PY" scripts/peers/roofline.py bound --model "$MODEL" --sentences "$SENTENCES" --batch "$BATCH" \
    --gflops "$BEST_GFLOPS" > "$OUT/bound.txt"
"$PY" scripts/peers/table.py --rows "$ROWS" --results "$RESULTS" --out "$OUT" \
    --gemm "$GEMM" --bound "$OUT/bound.txt" --optimizer "$ONNX/optimizer.txt" \
    --sentences "$SENTENCES" --repeat "$REPEAT" --threads "$THREADS" --batch "$BATCH" \
    --load "$LOAD_START / $(cut -d' ' -f1-3 /proc/loadavg)" \
    --cpu "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores${SHIM:+, not GenuineIntel}"
exit $failed
