#!/usr/bin/env bash
# all-MiniLM-L6-v2 sentence embeddings: streamfuse against PyTorch and candle, side by
# side in one run, on the same sentences (scripts/data/sentences-512.txt: 512
# sentences of 6-40 words), batch 32, 2 threads. Prints one table of sentences/s and
# peak resident memory, and how close each peer's embeddings are to streamfuse's.
#
#   scripts/compare-peers.sh            # REPEAT=3 runs of each, best sentences/s kept
#   REPEAT=1 BATCH=32 THREADS=2 SENTENCES=file.txt scripts/compare-peers.sh
#
# Installs what it needs under target/peers/: a Python virtual environment with torch
# (PyPI's wheel; large), numpy and tokenizers, and candle (crates.io) built as a
# separate cargo project target/peers/candle-bench, outside streamfuse's build.
# Not part of CI.
#
# PyTorch's x86 wheels use Intel MKL, whose sgemm takes a slow path on CPUs that do not
# report GenuineIntel. On such a CPU the table has a second PyTorch row with MKL's
# vendor check answered "Intel" by a preloaded shim (a one-line C function built here
# with cc), which is what a user who knows the trick gets: the fairer, faster baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PEERS=$ROOT/target/peers
REPEAT=${REPEAT:-3}
BATCH=${BATCH:-32}
THREADS=${THREADS:-2}
SENTENCES=${SENTENCES:-$ROOT/scripts/data/sentences-512.txt}
MODEL=${STREAMFUSE_MODEL_DIR:-$ROOT/target/models/all-MiniLM-L6-v2}
mkdir -p "$PEERS/out"
log() { echo "== $*" >&2; }

# --- inputs -----------------------------------------------------------------------
[ -f "$SENTENCES" ] || python3 scripts/gen_sentences.py > "$SENTENCES"
log "building streamfuse (release)"
cargo build --release --example minilm >&2
SF=$ROOT/target/release/examples/minilm
if [ ! -f "$MODEL/model.safetensors" ]; then
    log "fetching the model into $MODEL"
    "$SF" --model "$MODEL" >&2
fi

# --- PyTorch --------------------------------------------------------------------------
VENV=$PEERS/venv
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, numpy, tokenizers" 2>/dev/null; then
    log "installing torch, numpy, tokenizers from PyPI into $VENV (large download)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check torch numpy tokenizers >&2
fi
SHIM=""
if ! grep -q GenuineIntel /proc/cpuinfo && command -v cc >/dev/null; then
    echo 'int mkl_serv_intel_cpu_true(void) { return 1; }' > "$PEERS/mkl_shim.c"
    cc -shared -fPIC -O2 -o "$PEERS/libmkl_shim.so" "$PEERS/mkl_shim.c"
    SHIM=$PEERS/libmkl_shim.so
fi

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
cp scripts/peers/candle_bench.rs "$CANDLE/src/main.rs"
log "building candle-bench (release)"
cargo build --release --quiet --manifest-path "$CANDLE/Cargo.toml" >&2

# --- runs -----------------------------------------------------------------------------
# Each peer: a name and a command (run through env, so variables can lead).
NAMES=()
CMDS=()
add() { NAMES+=("$1"); CMDS+=("$2"); }
add "pytorch ($THREADS threads)" \
    "$VENV/bin/python scripts/peers/torch_bench.py --model $MODEL --sentences $SENTENCES --batch $BATCH --threads $THREADS --out OUT"
if [ -n "$SHIM" ]; then
    add "pytorch + MKL Intel shim" \
        "LD_PRELOAD=$SHIM $VENV/bin/python scripts/peers/torch_bench.py --model $MODEL --sentences $SENTENCES --batch $BATCH --threads $THREADS --out OUT"
fi
add "candle 0.11 ($THREADS threads)" \
    "RAYON_NUM_THREADS=$THREADS $CANDLE/target/release/candle-bench $MODEL $SENTENCES $BATCH OUT"
add "streamfuse --threads 1" \
    "$SF --model $MODEL --sentences $SENTENCES --batch $BATCH --threads 1 --out OUT"
add "streamfuse --threads $THREADS" \
    "$SF --model $MODEL --sentences $SENTENCES --batch $BATCH --threads $THREADS --out OUT"

declare -A BEST RSS CPU
have_time=0
[ -x /usr/bin/time ] && have_time=1
for r in $(seq 1 "$REPEAT"); do
    for i in "${!NAMES[@]}"; do
        out=$PEERS/out/peer$i.bin
        cmd=${CMDS[$i]//OUT/$out}
        log "run $r/$REPEAT: ${NAMES[$i]}"
        if [ $have_time = 1 ]; then
            text=$(eval "/usr/bin/time -v env $cmd" 2>"$PEERS/out/time$i.txt")
            kib=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$PEERS/out/time$i.txt")
            mib=$(awk -v k="$kib" 'BEGIN { printf "%.0f", k / 1024 }')
        else
            text=$(eval "env $cmd")
            mib=$(echo "$text" | awk '/^peak RSS:/ { printf "%.0f", $3 }')
        fi
        sps=$(echo "$text" | awk '/^sentences\/s:/ { print $2 }')
        cpu=$(echo "$text" | awk '/^cpu:/ { print $2 }')
        echo "$text" | sed 's/^/    /' >&2
        if [ -z "${BEST[$i]:-}" ] || awk -v a="$sps" -v b="${BEST[$i]}" 'BEGIN { exit !(a > b) }'; then
            BEST[$i]=$sps
        fi
        if [ -z "${CPU[$i]:-}" ] || awk -v a="$cpu" -v b="${CPU[$i]}" 'BEGIN { exit !(a < b) }'; then
            CPU[$i]=$cpu
        fi
        if [ -z "${RSS[$i]:-}" ] || [ "$mib" -gt "${RSS[$i]}" ]; then
            RSS[$i]=$mib
        fi
    done
done

# Agreement of every peer's embeddings with streamfuse's (--threads 1 run).
SF_OUT=$PEERS/out/peer$(( ${#NAMES[@]} - 2 )).bin
AGREE=$("$VENV/bin/python" - "$SF_OUT" "${#NAMES[@]}" "$PEERS/out" <<'EOF'
import sys, numpy as np
ref = np.fromfile(sys.argv[1], "<f4").reshape(-1, 384)
for i in range(int(sys.argv[2])):
    x = np.fromfile(f"{sys.argv[3]}/peer{i}.bin", "<f4").reshape(-1, 384)
    c = (x * ref).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(ref, axis=1))
    print(f"{c.min():.6f}")
EOF
)
mapfile -t AGREE_ROWS <<< "$AGREE"

TORCH_BEST=0
for i in "${!NAMES[@]}"; do
    case ${NAMES[$i]} in pytorch*) TORCH_BEST=$(awk -v a="${BEST[$i]}" -v b="$TORCH_BEST" 'BEGIN { print (a > b) ? a : b }') ;; esac
done
echo
echo "all-MiniLM-L6-v2, $(wc -l < "$SENTENCES") sentences, batch $BATCH, best of $REPEAT runs, $(nproc) cores"
printf '%-32s %12s %11s %13s %9s %14s %14s\n' "peer" "sentences/s" "vs pytorch" "peak RSS MiB" "CPU s" "sent/CPU-s" "min cos vs sf"
for i in "${!NAMES[@]}"; do
    ratio=$(awk -v a="${BEST[$i]}" -v b="$TORCH_BEST" 'BEGIN { printf "%.2fx", a / b }')
    per_cpu=$(awk -v n="$(wc -l < "$SENTENCES")" -v c="${CPU[$i]}" 'BEGIN { printf "%.0f", (c > 0) ? n / c : 0 }')
    printf '%-32s %12s %11s %13s %9s %14s %14s\n' "${NAMES[$i]}" "${BEST[$i]}" "$ratio" "${RSS[$i]}" "${CPU[$i]}" "$per_cpu" "${AGREE_ROWS[$i]}"
done
echo "('vs pytorch' divides by the best PyTorch row. CPU s: the least user + system time of the"
echo " timed part (tokenising + embedding) over the runs: on a machine shared with other work"
echo " it is steadier than wall time. min cos: each peer's embeddings against streamfuse's.)"
