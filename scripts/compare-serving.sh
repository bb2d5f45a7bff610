#!/usr/bin/env bash
# Serving all-MiniLM-L6-v2 under concurrent load: streamfuse's Embedder against ONNX
# Runtime, the same load shape, in process, in one run. CLIENTS client threads each
# send REQUESTS requests of 1..MAX_TEXTS texts drawn from SENTENCES (each client's
# choice seeded with SEED + client, so every peer gets the very same requests), one
# request at a time, and time each from send to answer.
#
#   onnxruntime   scripts/peers/ort_serve.py: one InferenceSession (fp32, BERT-
#                 optimised: ort_export.py's minilm-fp32-opt.onnx) shared by the
#                 client threads; each request tokenised (same tokenizer, truncation at
#                 256), padded to its longest text, one run() (intra-op threads THREADS)
#   streamfuse    examples/loadgen.rs --in-process: one Embedder shared by the client
#                 threads (workers THREADS, dynamic ragged batching up to
#                 MAX_BATCH_TOKENS tokens)
#   streamfuse    examples/serve.rs answering examples/loadgen.rs --url: the same
#     HTTP        Embedder behind the HTTP API; its RSS is the server process's
#
# The table gives each row's median texts/s, p50/p90/p99 latency over REPEAT runs
# (rows alternate within a repetition), the largest peak RSS (VmHWM) and the RSS
# LINGER seconds after the load ended, idle (streamfuse frees its pools and plan cache
# after 2 s idle; ONNX Runtime keeps its arena). Then streamfuse's texts/s over ONNX
# Runtime's and both p99s.
#
#   scripts/compare-serving.sh
#   CLIENTS=16 REQUESTS=40 MAX_TEXTS=8 REPEAT=3 THREADS=2 LINGER=10 scripts/compare-serving.sh
#   MODE=setup scripts/compare-serving.sh        # install, build and export; run nothing
#
# Other knobs: SEED, MAX_BATCH_TOKENS, SENTENCES, STREAMFUSE_MODEL_DIR (the model
# folder; default target/models/all-MiniLM-L6-v2), CARGO_TARGET_DIR.
#
# Sets up what it needs as scripts/compare-peers.sh does, sharing its files under
# target/peers/: the Python virtual environment venv/ (torch, which the export needs,
# numpy, tokenizers, onnxruntime, onnx; large) and the ONNX models in onnx/, exported
# once by scripts/peers/ort_export.py. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PEERS=$ROOT/target/peers
OUT=$PEERS/serving
CLIENTS=${CLIENTS:-16}
REQUESTS=${REQUESTS:-40}
MAX_TEXTS=${MAX_TEXTS:-8}
SEED=${SEED:-1}
REPEAT=${REPEAT:-3}
THREADS=${THREADS:-$(nproc)}
LINGER=${LINGER:-10}
MAX_BATCH_TOKENS=${MAX_BATCH_TOKENS:-2048}
MODE=${MODE:-all}
SENTENCES=${SENTENCES:-$ROOT/scripts/data/sentences-512.txt}
MODEL=${STREAMFUSE_MODEL_DIR:-$ROOT/target/models/all-MiniLM-L6-v2}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case $MODE in all | setup) ;; *)
    echo "MODE must be all or setup (got $MODE)" >&2
    exit 2
    ;;
esac
mkdir -p "$OUT"
log() { echo "== $*" >&2; }

# --- streamfuse -----------------------------------------------------------------------
log "building loadgen and serve (release)"
cargo build --release --example loadgen --example serve >&2
LOADGEN=$TARGET_DIR/release/examples/loadgen
SERVE=$TARGET_DIR/release/examples/serve
if [ ! -f "$MODEL/model.safetensors" ]; then
    log "fetching the model into $MODEL"
    "$LOADGEN" --in-process --model "$MODEL" --clients 1 --requests 1 --sentences "$SENTENCES" >&2
fi

# --- ONNX Runtime (the venv and export of compare-peers.sh) ----------------------------
# shellcheck source=scripts/peers/python-env.sh
. scripts/peers/python-env.sh
python_env
onnx_export
[ "$MODE" = setup ] && { log "set up; MODE=setup runs nothing"; exit 0; }

# --- the runs ---------------------------------------------------------------------------
LOAD=(--clients "$CLIENTS" --requests "$REQUESTS" --max-texts "$MAX_TEXTS" --sentences "$SENTENCES" --seed "$SEED")
RESULTS=$OUT/results.tsv
: > "$RESULTS"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

# Appends "row <tab> texts/s <tab> requests <tab> p50 <tab> p90 <tab> p99 <tab> peak <tab>
# after" from a run's output (the texts/s line, `peak RSS:` and `rss_after_idle_mib:`),
# or the peak and after given as $3 and $4 (the server's).
record() {
    local row=$1 file=$2 peak=${3:-} after=${4:-}
    local line
    line=$(grep '^texts/s:' "$file" | tail -1) || { log "$row: no result line"; cat "$file" >&2; return 1; }
    [ -n "$peak" ] || peak=$(awk '/^peak RSS:/ { print $3 }' "$file" | tail -1)
    [ -n "$after" ] || after=$(awk '/^rss_after_idle_mib:/ { print $2 }' "$file" | tail -1)
    echo "$line" | awk -v row="$row" -v peak="${peak:--}" -v after="${after:--}" \
        '{ printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row, $2, $4, $6, $8, $10, peak, after }' >> "$RESULTS"
}

# The value of a /proc/PID/status field in MiB.
proc_mib() { awk -v f="$2:" '$1 == f { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

run_http() {
    local port=$((20000 + RANDOM % 20000))
    local log_file=$OUT/serve.log
    "$SERVE" --bind "127.0.0.1:$port" --model "$MODEL" --workers "$THREADS" \
        --max-batch-tokens "$MAX_BATCH_TOKENS" > "$log_file" 2>&1 &
    local pid=$!
    local up=""
    for _ in $(seq 200); do
        if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then
            up=1
            break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if [ -z "$up" ]; then
        cat "$log_file" >&2
        kill "$pid" 2>/dev/null || true
        log "the server did not start"
        return 1
    fi
    local ok=0
    "$LOADGEN" --url "http://127.0.0.1:$port" "${LOAD[@]}" > "$OUT/http.txt" 2>&1 || ok=$?
    local peak after
    peak=$(proc_mib "$pid" VmHWM)
    sleep "$LINGER"
    after=$(proc_mib "$pid" VmRSS)
    kill -TERM "$pid"
    wait "$pid" || true
    [ "$ok" = 0 ] || { cat "$OUT/http.txt" >&2; return 1; }
    record "streamfuse HTTP (server)" "$OUT/http.txt" "$peak" "$after"
}

for rep in $(seq "$REPEAT"); do
    log "repetition $rep of $REPEAT: onnxruntime"
    "$PY" scripts/peers/ort_serve.py --onnx "$ONNX/minilm-fp32-opt.onnx" --model "$MODEL" \
        "${LOAD[@]}" --threads "$THREADS" --linger "$LINGER" > "$OUT/ort.txt" 2>&1 ||
        { cat "$OUT/ort.txt" >&2; exit 1; }
    record "onnxruntime fp32-opt" "$OUT/ort.txt"
    log "repetition $rep of $REPEAT: streamfuse in process"
    "$LOADGEN" --in-process --model "$MODEL" "${LOAD[@]}" --workers "$THREADS" \
        --max-batch-tokens "$MAX_BATCH_TOKENS" --linger "$LINGER" > "$OUT/sf.txt" 2>&1 ||
        { cat "$OUT/sf.txt" >&2; exit 1; }
    record "streamfuse in process" "$OUT/sf.txt"
    log "repetition $rep of $REPEAT: streamfuse over HTTP"
    run_http
done

# --- the table ----------------------------------------------------------------------------
echo
echo "all-MiniLM-L6-v2 serving: $CLIENTS clients x $REQUESTS requests of 1..$MAX_TEXTS texts" \
    "($(basename "$SENTENCES"), seed $SEED), $THREADS threads, $(nproc) cores;" \
    "medians of $REPEAT runs; load average before: $LOAD_START"
"$PY" - "$RESULTS" "$LINGER" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    rows.setdefault(f[0], []).append(f[1:])
def med(runs, i):
    v = [float(r[i]) for r in runs if r[i] not in ("", "-")]
    return statistics.median(v) if v else None
def big(runs, i):
    v = [float(r[i]) for r in runs if r[i] not in ("", "-")]
    return max(v) if v else None
def fmt(v, spec):
    return "-" if v is None else format(v, spec)
head = f"{'':<26} {'texts/s':>8} {'requests':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'peak RSS MiB':>13} {'RSS ' + sys.argv[2] + ' s after':>15}"
print(head)
stats = {}
for name, runs in rows.items():
    s = [med(runs, i) for i in range(5)]
    stats[name] = s
    print(f"{name:<26} {fmt(s[0], '8.1f')} {fmt(s[1], '8.0f')} {fmt(s[2], '8.1f')} {fmt(s[3], '8.1f')} "
          f"{fmt(s[4], '8.1f')} {fmt(big(runs, 5), '13.1f')} {fmt(big(runs, 6), '15.1f')}")
ort, sf = stats.get("onnxruntime fp32-opt"), stats.get("streamfuse in process")
if ort and sf and ort[0]:
    print(f"\nstreamfuse in process / onnxruntime: {sf[0] / ort[0]:.2f}x texts/s; "
          f"p99 {sf[4]:.1f} ms vs {ort[4]:.1f} ms")
EOF
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
