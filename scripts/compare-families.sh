#!/usr/bin/env bash
# The families at real size (issue 32): streamfuse (examples/embed, the Embedder with
# one worker and the cores for its kernels) against PyTorch (sentence-transformers'
# encode) and ONNX Runtime (the transformer exported with torch.onnx, graph optimiser
# at ORT_ENABLE_ALL, pooling in numpy), in one run, on random-initialised models of
# ModernBERT-base's and Qwen3-Embedding-0.6B's configs (scripts/peers/family_bench.py
# says exactly what each is and what is timed). Not in CI: the first run installs
# large packages from PyPI.
#
#   scripts/compare-families.sh [--rounds N] [--families "modernbert qwen3"]
#
# Two sections per family: batch BATCH (32), and one text a call (the first ONE
# sentences of SENTENCES). Rounds alternate the engines; the table gives medians of
# sentences/s and p50/p99 per call, the largest peak RSS, and each peer's smallest
# cosine to PyTorch's vectors. Knobs: SENTENCES (default the first 128 lines of
# scripts/data/sentences-512.txt), ONE (default 32), THREADS (2), BATCH (32).
#
# PyTorch's x86 wheels use Intel MKL, whose sgemm takes a slower path on CPUs that do
# not report GenuineIntel; on such a CPU PyTorch runs with the vendor check answered
# "Intel" by a preloaded one-line shim (what a user who knows the trick does), and the
# table says so.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=3
FAMILIES="modernbert qwen3"
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --families) FAMILIES=$2; shift 2 ;;
    *) echo "unknown argument $1 (options: --rounds N, --families LIST)" >&2; exit 2 ;;
    esac
done
PEERS=$ROOT/target/peers
DIR=$ROOT/target/families
OUT=$DIR/out
THREADS=${THREADS:-2}
BATCH=${BATCH:-32}
ONE=${ONE:-32}
MODEL=$ROOT/target/models/all-MiniLM-L6-v2
mkdir -p "$OUT"
log() { echo "== $*" >&2; }
SENTENCES=${SENTENCES:-$DIR/sentences.txt}
[ -f "$SENTENCES" ] || head -128 scripts/data/sentences-512.txt > "$SENTENCES"
head -"$ONE" "$SENTENCES" > "$OUT/one.txt"

log "building streamfuse (release)"
cargo build --release --example embed --example minilm >&2
SF=$ROOT/target/release/examples/embed
[ -f "$MODEL/tokenizer.json" ] || "$ROOT/target/release/examples/minilm" --model "$MODEL" >&2

# shellcheck source=scripts/peers/python-env.sh
. scripts/peers/python-env.sh
python_env
"$PY" -c "import sentence_transformers, transformers" 2>/dev/null ||
    "$PY" -m pip install --quiet --disable-pip-version-check sentence-transformers transformers >&2
SHIM=""
if ! grep -q GenuineIntel /proc/cpuinfo && command -v cc >/dev/null; then
    echo 'int mkl_serv_intel_cpu_true(void) { return 1; }' > "$PEERS/mkl_shim.c"
    cc -shared -fPIC -O2 -o "$PEERS/libmkl_shim.so" "$PEERS/mkl_shim.c"
    SHIM=$PEERS/libmkl_shim.so
fi
BENCH=scripts/peers/family_bench.py

for fam in $FAMILIES; do
    folder=$DIR/$fam
    if [ ! -f "$folder/modules.json" ]; then
        log "making $folder"
        "$PY" $BENCH make --kind "$fam" --tokenizer "$MODEL" --out "$folder" >&2
    fi
    if [ ! -f "$DIR/$fam.onnx" ] && [ ! -f "$DIR/$fam.onnx.failed" ]; then
        log "exporting $fam to ONNX"
        "$PY" $BENCH export --folder "$folder" --onnx "$DIR/$fam.onnx" > "$DIR/$fam.onnx.log" 2>&1 ||
            { tail -3 "$DIR/$fam.onnx.log" > "$DIR/$fam.onnx.failed"; log "the ONNX export of $fam failed"; }
    fi
done

# One measurement: engine, family, section -> $OUT/<engine>-<fam>-<section>-<round>.txt
measure() {
    local engine=$1 fam=$2 section=$3 round=$4 file batch
    file=$OUT/$engine-$fam-$section-$round
    if [ "$section" = batch ]; then batch=$BATCH; input=$SENTENCES; else batch=1; input=$OUT/one.txt; fi
    case $engine in
    streamfuse) "$SF" --folder "$DIR/$fam" --sentences "$input" --batch "$batch" \
        --out "$file.bin" > "$file.txt" ;;
    pytorch) env ${SHIM:+LD_PRELOAD=$SHIM} OMP_NUM_THREADS=$THREADS "$PY" $BENCH torch \
        --folder "$DIR/$fam" --sentences "$input" --batch "$batch" --threads "$THREADS" \
        --out "$file.npy" > "$file.txt" 2>/dev/null ;;
    onnxruntime) [ -f "$DIR/$fam.onnx" ] || return 0
        "$PY" $BENCH ort --folder "$DIR/$fam" --onnx "$DIR/$fam.onnx" --sentences "$input" \
            --batch "$batch" --threads "$THREADS" --out "$file.npy" > "$file.txt" 2>/dev/null ;;
    esac
}

for round in $(seq 1 "$ROUNDS"); do
    for fam in $FAMILIES; do
        for section in batch one; do
            for engine in streamfuse pytorch onnxruntime; do
                log "round $round: $fam $section $engine"
                measure $engine "$fam" $section "$round"
            done
        done
    done
done

"$PY" - "$OUT" "$ROUNDS" "$FAMILIES" "$BATCH" "$SHIM" <<'PYEOF' | tee "$OUT/table.md"
import glob, os, statistics, sys
import numpy as np
out, rounds, families, batch, shim = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5]
def field(path, name):
    for line in open(path):
        if line.startswith(name + ":"):
            return float(line.split(":")[1])
    return None
def vectors(engine, fam, section, r):
    p = f"{out}/{engine}-{fam}-{section}-{r}"
    if os.path.exists(p + ".npy"):
        return np.load(p + ".npy")
    if os.path.exists(p + ".bin"):
        ref = np.load(f"{out}/pytorch-{fam}-{section}-{r}.npy")
        return np.fromfile(p + ".bin", dtype=np.float32).reshape(ref.shape[0], -1)
    return None
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}; {rounds} rounds, engines alternated; medians")
for fam in families:
    for section, title in [("batch", f"batch {batch}"), ("one", "one text a call")]:
        print(f"\n### {fam}, {title}\n")
        print("| engine | sentences/s | p50 ms | p99 ms | peak RSS MiB | min cos to PyTorch |")
        print("| --- | --- | --- | --- | --- | --- |")
        for engine in ["streamfuse", "pytorch", "onnxruntime"]:
            files = [f"{out}/{engine}-{fam}-{section}-{r}.txt" for r in range(1, rounds + 1)]
            files = [f for f in files if os.path.exists(f) and os.path.getsize(f) > 0]
            if not files:
                print(f"| {engine} | – | – | – | – | not run |")
                continue
            med = lambda n: statistics.median(field(f, n) for f in files)
            rss = max(field(f, "peak_rss_mib") or 0 for f in files)
            ref, got = vectors("pytorch", fam, section, 1), vectors(engine, fam, section, 1)
            cos = (ref * got).sum(1).min() / 1.0 if ref is not None and got is not None else float("nan")
            print(f"| {engine} | {med('sentences/s'):.1f} | {med('p50_ms'):.1f} | {med('p99_ms'):.1f} | {rss:.0f} | {cos:.7f} |")
if shim:
    print("\nPyTorch ran with MKL's vendor check answered Intel (LD_PRELOAD shim).")
for fam in families:
    failed = f"{os.path.dirname(out)}/{fam}.onnx.failed"
    if os.path.exists(failed):
        print(f"\nONNX Runtime, {fam}: the export failed: {open(failed).read().strip()}")
PYEOF
