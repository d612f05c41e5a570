#!/usr/bin/env bash
# launch/bench/shared_cpu.sh — the demo's cpu throughput on a machine that other work
# shares: alone, and beside one busy process (a shell loop pinned to the last core), under
# each OpenMP waiting choice (docs/performance.md, "The cpu backend on a shared machine").
# Each case trains the demo for $STEPS steps (default 60) and reports the tok/s of the last
# log window (the first steps warm up); the cases alternate, $REPEATS times each (default
# 3); LOADS=alone (or busy) runs one half. Prints a markdown table last: the median and the
# best of the repeats (on a machine that others use too, the best is the closest to what
# the case gives on its own). docs/performance.md ran STEPS=45.
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${STEPS:-60}
repeats=${REPEATS:-3}
out=${SHARED_CPU_DIR:-runs/shared_cpu}
rm -rf "$out"
mkdir -p "$out"
last_core=$(( $(nproc) - 1 ))
cases=(
  "passive waiting (fathom's default)|"
  "libgomp's default spin (before)|GOMP_SPINCOUNT=300000"
  "short spin|GOMP_SPINCOUNT=10000"
  "active waiting|OMP_WAIT_POLICY=active"
  "one thread, passive|OMP_NUM_THREADS=1"
)
run_case() { # environment, log file
  # shellcheck disable=SC2086
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS $1 build/fathom train \
    launch/configs/demo.yaml --set run_dir="$out/run" --set train.steps="$steps" \
    --set log.every=$((steps / 3)) --set checkpoint.save_final=false >"$2" 2>&1
  rm -rf "$out/run"
  grep '^step' "$2" | tail -1 | sed -E 's/.*\| ([0-9.]+k?) tok\/s.*/\1/'
}
# "median (best)" of values such as 950 and 4.1k
summary() {
  tr ' ' '\n' | sed 's/k$/e3/' | sort -g |
    awk '{v[NR]=$1} END {printf "%.2fk (%.2fk)", v[int((NR+1)/2)]/1000, v[NR]/1000}'
}
declare -A results
busy_pid=""
trap '[ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null' EXIT
loads=${LOADS:-alone busy}
for load in $loads; do
  if [ "$load" = busy ]; then
    taskset -c "$last_core" sh -c 'while :; do :; done' &
    busy_pid=$!
  fi
  for ((r = 0; r < repeats; r++)); do
    for i in "${!cases[@]}"; do
      IFS='|' read -r _ environment <<<"${cases[$i]}"
      value=$(run_case "$environment" "$out/$load.$i.$r.log")
      results["$load,$i"]="${results["$load,$i"]:-} $value"
    done
  done
  if [ -n "$busy_pid" ]; then kill "$busy_pid"; busy_pid=""; fi
done
echo "| OpenMP threads | environment | alone: tok/s median (best) | beside a busy core |"
echo "|---|---|---|---|"
for i in "${!cases[@]}"; do
  IFS='|' read -r name environment <<<"${cases[$i]}"
  alone=$(echo ${results["alone,$i"]:-0} | summary)
  busy=$(echo ${results["busy,$i"]:-0} | summary)
  echo "| $name | ${environment:-(none)} | $alone | $busy |"
done
