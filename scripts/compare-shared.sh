#!/usr/bin/env bash
# all-MiniLM-L6-v2 on a machine shared with other work: streamfuse with and without its
# load cap (runtime/load.rs) against ONNX Runtime and PyTorch, in one run, rows
# alternated.
#
# Three conditions, each at one sentence a call (BATCHES="1 32": also at batch 32):
#   quiet       the engine alone
#   neighbour   beside one busy loop (`sh -c 'while :; do :; done'`): another
#               process that keeps one core busy, such as a build or a second service
#   two copies  two processes of the same engine at once, each sized to the whole
#               machine, as two server workers of one service are
# Rows:
#   streamfuse            examples/minilm (one stream, its kernel threads on every
#                         core), load cap on (the default)
#   streamfuse, no cap    the same with STREAMFUSE_LOAD_AWARE=0
#   onnxruntime           scripts/peers/ort_bench.py: the BERT-optimised fp32 model,
#                         intra-op threads = cores (as its users run it; it spins too)
#   pytorch               scripts/peers/torch_bench.py: threads = cores, with MKL's
#                         vendor check answered Intel on other CPUs (as compare-peers.sh)
# Every row embeds the 512 sentences of SENTENCES in sentence-transformers' order. The
# table gives medians over REPEAT runs of sentences/s (for two copies, the two
# processes' sum), p50 and p99 in ms (for two copies, the first process's).
#
#   scripts/compare-shared.sh
#   REPEAT=5 BATCHES="1 32" scripts/compare-shared.sh
#
# Uses target/peers/ as scripts/compare-peers.sh does (its venv and ONNX export,
# set up on first use). Linux only (the cap reads /proc). Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PEERS=$ROOT/target/peers
OUT=$PEERS/shared
REPEAT=${REPEAT:-3}
BATCHES=${BATCHES:-1}
SENTENCES=${SENTENCES:-$ROOT/scripts/data/sentences-512.txt}
MODEL=${STREAMFUSE_MODEL_DIR:-$ROOT/target/models/all-MiniLM-L6-v2}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
THREADS=$(nproc)
mkdir -p "$OUT"
log() { echo "== $*" >&2; }

log "building minilm (release)"
cargo build --release --example minilm >&2
MINILM=$TARGET_DIR/release/examples/minilm
# shellcheck source=scripts/peers/python-env.sh
. scripts/peers/python-env.sh
python_env
mkl_shim
onnx_export

RESULTS=$OUT/results.tsv
: > "$RESULTS"
HOG=""
stop_hog() {
    if [ -n "$HOG" ]; then
        kill "$HOG" 2>/dev/null || true
        wait "$HOG" 2>/dev/null || true
    fi
    HOG=""
}
trap stop_hog EXIT

# The command of row $1 at batch $2.
command_of() {
    local common="--model $MODEL --sentences $SENTENCES --batch $2"
    case $1 in
    sf) echo "$MINILM $common --threads 1" ;;
    sf-nocap) echo "env STREAMFUSE_LOAD_AWARE=0 $MINILM $common --threads 1" ;;
    ort) echo "$PY scripts/peers/ort_bench.py --onnx $ONNX/minilm-fp32-opt.onnx $common --threads $THREADS" ;;
    torch) echo "env ${SHIM:+LD_PRELOAD=$SHIM} $PY scripts/peers/torch_bench.py $common --threads $THREADS" ;;
    esac
}

# The value of "$2:" in output file $1.
field() { awk -v k="$2:" '{ for (i = 1; i < NF; i++) if ($i == k) v = $(i + 1) } END { print v }' "$1"; }

# Runs row $1 at batch $2 under condition $3 and appends "condition row batch
# sentences/s p50 p99" to the results.
run() {
    local row=$1 batch=$2 cond=$3 cmd
    cmd=$(command_of "$row" "$batch")
    case $cond in
    quiet) $cmd > "$OUT/a.txt" 2>&1 ;;
    neighbour)
        sh -c 'while :; do :; done' &
        HOG=$!
        sleep 0.5
        $cmd > "$OUT/a.txt" 2>&1
        stop_hog
        ;;
    two)
        $cmd > "$OUT/b.txt" 2>&1 &
        local other=$!
        $cmd > "$OUT/a.txt" 2>&1
        wait "$other"
        ;;
    esac
    local rate
    rate=$(field "$OUT/a.txt" sentences/s)
    [ -n "$rate" ] || { cat "$OUT/a.txt" >&2; log "$row: no result"; return 1; }
    [ "$cond" = two ] && rate=$(awk -v a="$rate" -v b="$(field "$OUT/b.txt" sentences/s)" 'BEGIN { print a + b }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$cond" "$row" "$batch" "$rate" \
        "$(field "$OUT/a.txt" p50_ms)" "$(field "$OUT/a.txt" p99_ms)" >> "$RESULTS"
}

for rep in $(seq "$REPEAT"); do
    for batch in $BATCHES; do
        for cond in quiet neighbour two; do
            log "repetition $rep of $REPEAT: batch $batch, $cond"
            for row in sf sf-nocap ort torch; do
                run "$row" "$batch" "$cond"
            done
        done
    done
done

echo
echo "all-MiniLM-L6-v2 on a shared machine: $(basename "$SENTENCES"), $THREADS cores" \
    "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); medians of $REPEAT runs"
"$PY" - "$RESULTS" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    cond, row, batch, *v = line.split()
    runs.setdefault((int(batch), cond, row), []).append([float(x) for x in v])
names = {"sf": "streamfuse", "sf-nocap": "streamfuse, no cap", "ort": "onnxruntime", "torch": "pytorch"}
conds = {"quiet": "quiet", "neighbour": "busy neighbour", "two": "two copies"}
print(f"{'batch':>5} {'condition':<15} {'engine':<20} {'sentences/s':>11} {'p50 ms':>8} {'p99 ms':>8}")
for (batch, cond, row), v in sorted(runs.items(), key=lambda kv: (kv[0][0], list(conds).index(kv[0][1]), list(names).index(kv[0][2]))):
    m = [statistics.median(x[i] for x in v) for i in range(3)]
    print(f"{batch:>5} {conds[cond]:<15} {names[row]:<20} {m[0]:>11.1f} {m[1]:>8.2f} {m[2]:>8.2f}")
for batch in sorted({k[0] for k in runs}):
    for cond in ("neighbour", "two"):
        get = lambda row: statistics.median(x[0] for x in runs.get((batch, cond, row), [[0]]))
        if get("sf-nocap") and get("ort") and get("torch"):
            print(f"batch {batch}, {conds[cond]}: streamfuse {get('sf') / get('sf-nocap'):.2f}x its uncapped self, "
                  f"{get('sf') / get('ort'):.2f}x onnxruntime, {get('sf') / get('torch'):.2f}x pytorch (sentences/s)")
EOF
