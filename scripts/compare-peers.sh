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
#   scripts/compare-peers.sh --isa avx2      # streamfuse forced to a tier, peers capped
#   REPEAT=5 BATCH=32 THREADS=2 SENTENCES=file.txt scripts/compare-peers.sh
#   MODE=batch scripts/compare-peers.sh      # only the batch-BATCH section
#   MODE=latency scripts/compare-peers.sh    # only the batch-1 section
#   MODE=setup scripts/compare-peers.sh      # install, build and export; run nothing
#
# Knobs: REPEAT (runs of each row; the table gives the median sentences/s, p50, p99 and
# CPU time, and the largest peak RSS), BATCH, THREADS (each peer's thread count: torch
# intra-op threads, ONNX Runtime intra_op_num_threads, OpenVINO INFERENCE_NUM_THREADS,
# candle's rayon threads, streamfuse --threads), SENTENCES, MODE, CANDLE (0: leave
# candle out, neither built nor run; its cold build takes long), STREAMFUSE_MODEL_DIR
# (the model folder; default target/models/all-MiniLM-L6-v2), CARGO_TARGET_DIR (where
# streamfuse builds).
#
# --isa TIER runs streamfuse's rows with STREAMFUSE_ISA=TIER (a tier this CPU has:
# `cargo run --example tiers` lists them; no value, or a tier it lacks, is an error).
# When TIER is below the CPU's own, the peers that can be capped are capped to the same
# instruction set: PyTorch (ATEN_CPU_CAPABILITY for ATen's vector kernels,
# MKL_ENABLE_INSTRUCTIONS for MKL's sgemm, ONEDNN_MAX_CPU_ISA for oneDNN), OpenVINO
# (ONEDNN_MAX_CPU_ISA: its CPU plugin's kernels come from oneDNN's dispatcher, except
# its MLAS sgemm and some JIT kernels of its own, which ignore it: when the probe finds
# such kernels above the cap, the OpenVINO rows are marked "partial cap" and count as
# an upper reference, not a capped peer) and the matmul rate the FLOP bound comes from
# (MKL through torch, OPENBLAS_CORETYPE for numpy's OpenBLAS). ONNX Runtime (MLAS
# picks its kernels from CPUID when it loads and reads no variable that caps them) and
# candle (the gemm crate detects for itself) run uncapped: an upper reference. Under
# each table the f32 targets are read against the best capped fp32 peer, and also
# against each upper reference. Under the tables the run states which rows ran capped
# and how, and prints the evidence that the caps took: get_cpu_capability(), MKL's and
# oneDNN's verbose banners, OpenBLAS's core and OpenVINO's kernels, with and without
# the cap (scripts/peers/isa_probe.py). When TIER is the CPU's own (e.g. --isa avx2 on
# a CPU without AVX-512), everything runs natively. Without --isa, streamfuse runs at
# the CPU's own tier (STREAMFUSE_ISA and STREAMFUSE_PORTABLE in the environment are
# ignored) and nothing is capped.
#
# OpenVINO runs the plain fp32 ONNX export as its users run it (openvino_bench.py):
# compile_model(..., "CPU") with the THROUGHPUT hint and an async request queue at batch
# BATCH, the LATENCY hint and one infer() at a time at batch 1, INFERENCE_NUM_THREADS =
# THREADS; its row names the precision it inferred in (bf16 by default on CPUs with
# AMX or AVX512_BF16, where it is not counted as an fp32 peer).
#
# Installs what it needs under target/peers/ by itself: a Python virtual environment
# (venv/) with torch (PyPI's wheel; large), numpy, tokenizers, onnxruntime, onnx and
# openvino;
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
ISA=""
while [ $# -gt 0 ]; do
    case $1 in
    --isa | --isa=*)
        if [ "$1" = --isa ]; then
            ISA=${2:-}
            shift $(($# >= 2 ? 2 : 1))
        else
            ISA=${1#--isa=}
            shift
        fi
        if [ -z "$ISA" ] || [ "${ISA#-}" != "$ISA" ]; then
            echo "--isa needs a tier, one this CPU has (cargo run --example tiers lists them)" >&2
            exit 2
        fi
        ;;
    -h | --help)
        sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"
        exit 0
        ;;
    *)
        echo "unknown argument $1: the one option is --isa TIER; the rest are environment knobs (--help)" >&2
        exit 2
        ;;
    esac
done
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
cargo build --release --example minilm --example tiers >&2
SF=$TARGET_DIR/release/examples/minilm
TIERS=$TARGET_DIR/release/examples/tiers

# --- the tier: streamfuse's forced, the peers capped to match -------------------------
if [ -z "$ISA" ] && [ -n "${STREAMFUSE_ISA:-}${STREAMFUSE_PORTABLE:-}" ]; then
    log "STREAMFUSE_ISA / STREAMFUSE_PORTABLE in the environment are ignored: use --isa TIER"
fi
unset STREAMFUSE_ISA STREAMFUSE_PORTABLE
TIER_LIST=$("$TIERS")
TOP=$(awk '$2 == "*" { print $1 }' <<< "$TIER_LIST")
HAVE=$(awk '{ print $1 }' <<< "$TIER_LIST" | paste -sd' ')
if [ -n "$ISA" ] && ! err=$(STREAMFUSE_ISA=$ISA "$TIERS" 2>&1 >/dev/null); then
    echo "--isa $ISA: $err" >&2
    exit 2
fi
# SF_ENV leads streamfuse's commands; TORCH_CAP PyTorch's (and the torch matmul
# measurement's); OV_CAP OpenVINO's; OBLAS_CAP the numpy measurement's. Each row's
# fifth field in rows.tsv says how it ran: native, forced TIER, cap X or uncapped.
SF_ENV="" SF_LABEL=native TORCH_CAP="" OV_CAP="" OBLAS_CAP="" PEER_LABEL=native OPEN_LABEL=native
OV_LABEL=native
[ -n "$ISA" ] && SF_ENV="STREAMFUSE_ISA=$ISA"
if [ -n "$ISA" ] && [ "$ISA" != "$TOP" ]; then
    SF_LABEL="forced $ISA" PEER_LABEL=uncapped OV_LABEL=uncapped OPEN_LABEL=uncapped
    # Each library's nearest setting at or below the tier (portable is baseline x86-64,
    # whose nearest in MKL is SSE4.2). A cap is a ceiling: a library still uses no
    # instruction the CPU lacks.
    case $ISA in
    portable) aten=default mkl=SSE4_2 dnnl=SSE41 oblas=Prescott ;;
    avx2) aten=avx2 mkl=AVX2 dnnl=AVX2 oblas=Haswell ;;
    avx2-vnni) aten=avx2 mkl=AVX2 dnnl=AVX2_VNNI oblas=Haswell ;;
    avx512) aten=avx512 mkl=AVX512 dnnl=AVX512_CORE oblas=SkylakeX ;;
    avx512-vnni) aten=avx512 mkl=AVX512_E1 dnnl=AVX512_CORE_BF16 oblas=SkylakeX ;;
    *) aten="" ;; # aarch64's tiers: no cap known for the peers' libraries
    esac
    if [ -n "$aten" ]; then
        TORCH_CAP="ATEN_CPU_CAPABILITY=$aten MKL_ENABLE_INSTRUCTIONS=$mkl ONEDNN_MAX_CPU_ISA=$dnnl"
        OV_CAP="ONEDNN_MAX_CPU_ISA=$dnnl"
        OBLAS_CAP="OPENBLAS_CORETYPE=$oblas"
        PEER_LABEL="cap $ISA"
        OV_LABEL="cap $ISA" # "partial cap" when the probe finds kernels above it
    fi
fi
log "tiers of this CPU: $HAVE (its own: $TOP); streamfuse runs ${ISA:-$TOP}${TORCH_CAP:+; peers capped: $TORCH_CAP}"
if [ ! -f "$MODEL/model.safetensors" ]; then
    log "fetching the model into $MODEL"
    "$SF" --model "$MODEL" >&2
fi

# --- Python: PyTorch, ONNX Runtime ---------------------------------------------------
# shellcheck source=scripts/peers/python-env.sh
. scripts/peers/python-env.sh
python_env
mkl_shim
onnx_export
sed 's/^/    /' "$OUT/export.txt" >&2


# --- candle ---------------------------------------------------------------------------
WITH_CANDLE=${CANDLE:-1}
CANDLE=$PEERS/candle-bench
if [ "$WITH_CANDLE" != 0 ]; then
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
fi

[ "$MODE" = setup ] && { log "set up; MODE=setup runs nothing"; exit 0; }

# --- what each row runs: the statement under the table, with its evidence ------------
# isa_probes LABEL TORCH_ENV OPENVINO_ENV NUMPY_ENV: isa_probe.py's lines for each peer
# library, run under the given variables.
isa_probes() {
    echo "  $1:"
    # shellcheck disable=SC2086
    {
        env $2 "$PY" scripts/peers/isa_probe.py torch
        env $3 "$PY" scripts/peers/isa_probe.py openvino --onnx "$ONNX/minilm-fp32.onnx" \
            --model "$MODEL" --threads "$THREADS"
        env $4 "$PY" scripts/peers/isa_probe.py numpy
    } </dev/null 2>&1 | sed 's/^/    /'
}
# Lines of the capped probes naming an instruction set above the cap get a mark.
case $ISA in
portable) above='avx|AVX|sse4|SSE4' ;;
avx2 | avx2-vnni) above='avx512|AVX512|AVX-512|amx|AMX' ;;
*) above='amx|AMX' ;;
esac
CAPS=$OUT/caps.txt
log "which instruction set each row runs (the evidence: $CAPS)"
{
    echo "instruction sets (--isa ${ISA:-not given}; this CPU's tiers: $HAVE; its own: $TOP):"
    if [ -n "$TORCH_CAP" ]; then
        capped=$(isa_probes "with the caps" "$TORCH_CAP" "$OV_CAP" "$OBLAS_CAP")
        # OpenVINO follows ONEDNN_MAX_CPU_ISA only where its kernels come from oneDNN's
        # dispatcher: when the probe shows kernels above the cap, its rows are a partial
        # cap, an upper reference rather than a capped peer.
        ov_part="" candle_note=""
        [ "$WITH_CANDLE" != 0 ] && candle_note=", candle (the gemm crate detects the CPU's features itself)"
        if grep '^    openvino: ' <<< "$capped" | grep -qE "$above"; then
            OV_LABEL="partial cap $ISA"
            ov_part="; only in part: the kernels marked '!' below ignore the cap, so these rows are an upper reference too"
        fi
        echo "  streamfuse rows: $SF_ENV (the tiers example under it marks" \
            "$(env "$SF_ENV" "$TIERS" | awk '$2 == "*" { print $1 }') as the tier in use)"
        echo "  capped to $ISA: the PyTorch rows ($TORCH_CAP); the matmul GFLOP/s (torch under" \
            "PyTorch's cap, numpy with $OBLAS_CAP); the OpenVINO rows ($OV_CAP$ov_part)"
        echo "  not capped, an upper reference: the ONNX Runtime rows (MLAS picks its kernels from" \
            "CPUID and XGETBV when it loads and reads no variable that caps them)${candle_note}"
        sed -E "/$above/ s/^    /  ! above the cap: /" <<< "$capped"
        isa_probes "without them" "" "" ""
    elif [ "$SF_LABEL" != native ]; then
        echo "  streamfuse rows: $SF_ENV; no cap is known for the peers' libraries on this family:" \
            "every peer runs natively, uncapped"
        isa_probes "the peers" "" "" ""
    else
        echo "  every row runs natively, at this CPU's own tier${ISA:+ (--isa $ISA is that tier)}"
        isa_probes "the peers" "" "" ""
    fi
} > "$CAPS"
sed 's/^/    /' "$CAPS" >&2

# --- the machine's matmul rate ----------------------------------------------------------
# Measured before each repetition of the rows, so that one burst of other work on the
# machine does not set the limit; the table keeps the best of the measurements.
GEMM=$OUT/gemm.txt
: > "$GEMM"
GEMM_THREADS=1
[ "$THREADS" != 1 ] && GEMM_THREADS="1 $THREADS"
measure_gemm() {
    log "matmul GFLOP/s (torch/MKL${SHIM:+ with the shim}, numpy/OpenBLAS; threads: $GEMM_THREADS)${TORCH_CAP:+, capped}"
    local before
    before=$(wc -l < "$GEMM")
    # shellcheck disable=SC2086
    env ${SHIM:+LD_PRELOAD=$SHIM} $TORCH_CAP "$PY" scripts/peers/roofline.py gemm --lib torch \
        --threads $GEMM_THREADS >> "$GEMM" </dev/null
    for t in $GEMM_THREADS; do
        # shellcheck disable=SC2086
        env $OBLAS_CAP OPENBLAS_NUM_THREADS=$t "$PY" scripts/peers/roofline.py gemm --lib numpy \
            --threads "$t" >> "$GEMM" </dev/null
    done
    tail -n +"$((before + 1))" "$GEMM" | sed 's/^/    /' >&2
}

# --- rows -----------------------------------------------------------------------------
# A row: section (the batch size), a role (what the table compares it with), a name,
# a command (run through env, so variables can lead; OUT is the embeddings file) and
# how it runs (native, forced TIER, cap TIER or uncapped; native when left out).
ROWS=$OUT/rows.tsv
: > "$ROWS"
CMDS=()
add() {
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${#CMDS[@]}" "${5:-native}" >> "$ROWS"
    CMDS+=("$4")
}
rows_for() { # batch
    local b=$1 common="--model $MODEL --sentences $SENTENCES --batch $1"
    local sf="$SF_ENV $SF" torch="$TORCH_CAP $PY scripts/peers/torch_bench.py"
    local hint=THROUGHPUT
    [ "$b" = 1 ] && hint=LATENCY
    add "$b" torch "pytorch ($THREADS threads)" \
        "$torch $common --threads $THREADS --out OUT" "$PEER_LABEL"
    if [ -n "$SHIM" ]; then
        add "$b" torch "pytorch + MKL Intel shim" \
            "LD_PRELOAD=$SHIM $torch $common --threads $THREADS --out OUT" "$PEER_LABEL"
    fi
    if [ -z "$TORCH_CAP" ] && grep -qw amx_bf16 /proc/cpuinfo; then
        # Not an fp32 peer (its products are bf16): the row a PyTorch user on an AMX
        # CPU gets by trading accuracy for speed, beside streamfuse's bf16x3 and bf16.
        add "$b" torch-bf16 "pytorch, AMX bf16 matmuls" \
            "$PY scripts/peers/torch_bench.py $common --threads $THREADS --fp32-precision bf16 --out OUT"
    fi
    add "$b" ort-fp32 "onnxruntime fp32 ($THREADS threads)" \
        "$PY scripts/peers/ort_bench.py --onnx $ONNX/minilm-fp32-opt.onnx $common --threads $THREADS --out OUT" \
        "$OPEN_LABEL"
    add "$b" ort-int8 "onnxruntime int8 ($THREADS threads)" \
        "$PY scripts/peers/ort_bench.py --onnx $ONNX/minilm-int8.onnx $common --threads $THREADS --out OUT" \
        "$OPEN_LABEL"
    add "$b" ort-int8 "onnxruntime int8 per-channel" \
        "$PY scripts/peers/ort_bench.py --onnx $ONNX/minilm-int8-pc.onnx $common --threads $THREADS --out OUT" \
        "$OPEN_LABEL"
    add "$b" ov "openvino ($THREADS threads, $hint)" \
        "$OV_CAP $PY scripts/peers/openvino_bench.py --onnx $ONNX/minilm-fp32.onnx $common --threads $THREADS --out OUT" \
        "$OV_LABEL"
    [ "$WITH_CANDLE" != 0 ] && add "$b" candle "candle $CANDLE_VERSION ($THREADS threads)" \
        "RAYON_NUM_THREADS=$THREADS $CANDLE_BIN $MODEL $SENTENCES $b OUT" "$OPEN_LABEL"
    if [ "$b" = 1 ]; then
        add "$b" sf-ref "streamfuse 1 stream (--threads 1)" "$sf $common --threads 1 --out OUT" "$SF_LABEL"
        [ "$THREADS" != 1 ] && add "$b" sf "streamfuse $THREADS streams (--threads $THREADS)" \
            "$sf $common --threads $THREADS --out OUT" "$SF_LABEL"
        for p in bf16x3 bf16 int8; do
            add "$b" "sf-$p" "streamfuse $p 1 stream" \
                "$sf $common --threads 1 --precision $p --out OUT" "$SF_LABEL"
        done
    else
        add "$b" sf-ref "streamfuse --threads 1" "$sf $common --threads 1 --out OUT" "$SF_LABEL"
        [ "$THREADS" != 1 ] && add "$b" sf "streamfuse --threads $THREADS" \
            "$sf $common --threads $THREADS --out OUT" "$SF_LABEL"
        for p in bf16x3 bf16 int8; do
            add "$b" "sf-$p" "streamfuse $p --threads $THREADS" \
                "$sf $common --threads $THREADS --precision $p --out OUT" "$SF_LABEL"
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
    while IFS=$'\t' read -r section role name i _isa; do
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
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$section" "$i" "$r" "$status" \
            "$(field sentences/s:)" "$(field cpu:)" "${mib:-}" "$(field p50_ms:)" \
            "$(field p99_ms:)" "$(field inference_precision:)" >> "$RESULTS"
    done < "$ROWS"
done

# --- the FLOP bound and the table -----------------------------------------------------
BEST_GFLOPS=$(awk -v t="$THREADS" '$3 == t && $5 > b { b = $5 } END { print b + 0 }' "$GEMM")
"$PY" scripts/peers/roofline.py bound --model "$MODEL" --sentences "$SENTENCES" --batch "$BATCH" \
    --gflops "$BEST_GFLOPS" > "$OUT/bound.txt"
"$PY" scripts/peers/table.py --rows "$ROWS" --results "$RESULTS" --out "$OUT" \
    --gemm "$GEMM" --bound "$OUT/bound.txt" --optimizer "$ONNX/optimizer.txt" \
    --sentences "$SENTENCES" --repeat "$REPEAT" --threads "$THREADS" --batch "$BATCH" \
    --caps "$CAPS" --gemm-note "${TORCH_CAP:+capped to $ISA like the PyTorch rows (torch: $TORCH_CAP; numpy: $OBLAS_CAP)}" \
    --load "$LOAD_START / $(cut -d' ' -f1-3 /proc/loadavg)" \
    --cpu "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores${SHIM:+, not GenuineIntel}"
exit $failed
