#!/usr/bin/env bash
# examples/python/ray_embed.py on a local Ray cluster with 1 and 2 actors, against the
# same Embedder in a plain loop without Ray (issue 33); not in CI (Ray is a large
# download: scripts/setup-ray.sh makes target/ray/venv). Starts a head node on this
# machine (`ray start --head --block`, stopped by its pid at the end), makes a corpus
# of REPEAT copies of the sentences file (default 8: 4096 texts), then runs the three
# ROUNDS times (default 3), alternated, and prints each run and the medians of texts/s
# (each run: from the pipeline's start, model loading in the actors included, to the
# last Parquet file written; ray.init is not counted).
#
#   scripts/compare-ray.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
REPEAT=${REPEAT:-8}
MODEL=${STREAMFUSE_MODEL_DIR:-$PWD/target/models/all-MiniLM-L6-v2}
SENTENCES=${SENTENCES:-scripts/data/sentences-512.txt}
PY=$(scripts/setup-ray.sh)
RAY=$(dirname "$PY")/ray
DIR=target/ray
CORPUS=$DIR/corpus.txt
for _ in $(seq "$REPEAT"); do cat "$SENTENCES"; done > "$CORPUS"
echo "== corpus: $(wc -l < "$CORPUS") texts ($REPEAT copies of $SENTENCES)" >&2

"$RAY" start --head --num-cpus "$(nproc)" --include-dashboard false --block \
    > "$DIR/head.log" 2>&1 &
HEAD=$!
trap 'kill "$HEAD" 2>/dev/null; wait "$HEAD" 2>/dev/null || true' EXIT
for _ in $(seq 60); do
    grep -q "Ray runtime started" "$DIR/head.log" && break
    sleep 1
done
grep -q "Ray runtime started" "$DIR/head.log" || { cat "$DIR/head.log" >&2; exit 1; }

declare -A RATES
for r in $(seq "$ROUNDS"); do
    for how in none 1 2; do
        rm -rf "$DIR/out-$how"
        if [ "$how" = none ]; then
            args=(--no-ray)
        else
            args=(--actors "$how" --address auto)
        fi
        line=$("$PY" examples/python/ray_embed.py --input "$CORPUS" --output "$DIR/out-$how" \
            --model "$MODEL" "${args[@]}" 2>>"$DIR/runs.log" | tail -n 1)
        echo "round $r: $line"
        RATES[$how]="${RATES[$how]:-} $(sed -E 's/.*: ([0-9]+) texts\/s.*/\1/' <<< "$line")"
    done
done
median() { tr ' ' '\n' <<< "$1" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(median "${RATES[none]}")
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "medians of $ROUNDS alternated rounds, texts/s:"
echo "- no Ray (plain loop): $base"
for a in 1 2; do
    m=$(median "${RATES[$a]}")
    echo "- Ray Data, $a actor(s): $m ($(awk -v m="$m" -v b="$base" 'BEGIN {printf "%.2f", m / b}')x the plain loop)"
done
