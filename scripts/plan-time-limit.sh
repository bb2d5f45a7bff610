#!/usr/bin/env bash
# Times `streamfuse-plan --time-limit 1 --out` (release) on a synthetic trace of
# a million buffers (scripts/gen-plan-trace.py, fixed seed) and prints the wall
# time of each run and their median. The time limit bounds the planning; reading,
# validating and writing come on top, so a few seconds in all is the target.
#
# usage: scripts/plan-time-limit.sh [BUFFERS] [RUNS] [LIMIT]   (1000000, 3, 1)
# The trace is cached in ${TMPDIR:-/tmp}; $PLAN_BIN overrides the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000000}"
RUNS="${2:-3}"
LIMIT="${3:-1}"
DIR="${TMPDIR:-/tmp}/streamfuse-plan-time-limit"
mkdir -p "$DIR"
TRACE="$DIR/trace.$N.csv"
if [[ ! -s "$TRACE" ]]; then
  python3 scripts/gen-plan-trace.py "$N" 42 > "$TRACE.tmp"
  mv "$TRACE.tmp" "$TRACE"
fi
if [[ -z "${PLAN_BIN:-}" ]]; then
  cargo build --release --quiet --bin streamfuse-plan
  PLAN_BIN="${CARGO_TARGET_DIR:-target}/release/streamfuse-plan"
fi
walls=()
for r in $(seq "$RUNS"); do
  t0=$(date +%s.%N)
  summary=$("$PLAN_BIN" "$TRACE" --time-limit "$LIMIT" --out "$DIR/out.csv" | tail -1)
  t1=$(date +%s.%N)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  walls+=("$wall")
  printf "run %d: wall %.2f s  %s\n" "$r" "$wall" "$summary"
done
median=$(printf "%s\n" "${walls[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
printf "buffers %s, --time-limit %s: median wall %.2f s over %d runs\n" "$N" "$LIMIT" "$median" "$RUNS"
