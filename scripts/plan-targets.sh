#!/usr/bin/env bash
# Runs the release planner on every trace in ../shared/data (or $1) with the
# default strategy and with greedy-size as a baseline, and prints a table.
# Files named NAME.CAPACITY.csv are run with --capacity CAPACITY.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
# $PLAN_BIN runs another build (a baseline) instead of building this one.
if [[ -n "${PLAN_BIN:-}" ]]; then
  BIN="$PLAN_BIN"
else
  cargo build --release --quiet --bin streamfuse-plan
  BIN="${CARGO_TARGET_DIR:-target}/release/streamfuse-plan"
fi
printf "%-16s %7s %14s | %14s %9s %7s %4s | %14s %9s %7s\n" file buffers lower_bound "best arena" ratio millis exit "greedy arena" ratio millis
for f in $(find "$DATA" -name '*.csv' | sort); do
  name=$(basename "$f")
  cap=()
  if [[ "$name" =~ \.([0-9]+)\.csv$ ]]; then cap=(--capacity "${BASH_REMATCH[1]}"); fi
  set +e
  best=$($BIN "$f" "${cap[@]}" 2>/dev/null | tail -1); rc=$?
  greedy=$($BIN "$f" --strategy greedy-size 2>/dev/null | tail -1)
  set -e
  get() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
  printf "%-16s %7s %14s | %14s %9s %7s %4s | %14s %9s %7s\n" "$name" "$(get "$best" buffers)" "$(get "$best" lower_bound)" \
    "$(get "$best" arena)" "$(get "$best" ratio)" "$(get "$best" millis)" "$rc" \
    "$(get "$greedy" arena)" "$(get "$greedy" ratio)" "$(get "$greedy" millis)"
done
