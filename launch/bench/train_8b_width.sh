#!/usr/bin/env bash
# launch/bench/train_8b_width.sh — `fathom train` at the 8B width on one GPU: d 4096, 32/8
# heads, ffn 14336, vocab 128256, blocks of 2 layers, 4 x 4096 tokens a step (4 microbatches
# of 1), synthetic data, no checkpoint or eval. For each residual it prints the steady-state
# rate: the median tokens_per_s of the steps after the first two (plan building, workspace
# growth and cuBLASLt heuristics happen in step 1). docs/performance.md, 2026-12-01.
#   launch/bench/train_8b_width.sh LAYERS [STEPS] [RESIDUAL ...]
# RESIDUAL: standard, mhar_delta (H 8), attnres_delta (H 1), mhar_replace (H 8); default
# the first three. FATHOM_BINARY names the binary (default build/fathom); logs go to
# $OUT (or /tmp/train-8b-width). Prints "tag residual layers tok/s step_ms mem_gib mfu" lines;
# where nvidia-smi is there, each line ends with the run's median SM clock and power draw
# under load (sampled every 200 ms, samples above 300 W): whether the step ran at its
# power limit (docs/performance.md, "(seventh run)": kernels 12% slower in the step than
# one at a time).
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:?layers}
steps=${2:-6}
shift $(($# < 2 ? $# : 2))
residuals=("$@")
[ ${#residuals[@]} -eq 0 ] && residuals=(standard mhar_delta attnres_delta)
binary=${FATHOM_BINARY:-build/fathom}
out=${OUT:-/tmp/train-8b-width}
tag=${TRAIN_TAG:-run}
mkdir -p "$out"
. launch/bench/train_8b_command.sh
for residual in "${residuals[@]}"; do
  dir=/tmp/train-8b-width-runs/$tag-$residual-$layers
  train_8b_command "$binary" "$dir" "$layers" "$steps" "$residual" || exit 2
  rm -rf "$dir"
  log=$out/$tag-$residual-$layers.log
  clocks=$out/$tag-$residual-$layers.clocks
  : >"$clocks"
  sampler=
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=clocks.sm,power.draw,power.limit --format=csv,noheader,nounits \
      -lms 200 >"$clocks" 2>/dev/null &
    sampler=$!
  fi
  "${train_8b[@]}" >"$log" 2>&1
  status=$?
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  python3 - "$dir/metrics.jsonl" "$residual" "$layers" "$status" "$tag" "$clocks" <<'PY'
import json, statistics, sys
path, residual, layers, status, tag, clocks = sys.argv[1:]
try:
    lines = [json.loads(l) for l in open(path)]
except OSError:
    lines = []
steps = [l for l in lines if "tokens_per_s" in l][2:]
if not steps:
    print(f"{tag} {residual} {layers} FAILED (exit {status})")
    sys.exit(0)
rate = statistics.median(l["tokens_per_s"] for l in steps)
mfu = statistics.median(l.get("mfu", float("nan")) for l in steps)
def numbers(line):
    try:
        return [float(x) for x in line.split(",")]
    except ValueError:
        return []
load = [n for n in map(numbers, open(clocks)) if len(n) == 3 and n[1] > 300]
power = ""
if load:
    power = (f" sm {statistics.median(n[0] for n in load):.0f} MHz "
             f"{statistics.median(n[1] for n in load):.0f} W of {load[0][2]:.0f}")
print(f"{tag} {residual} {layers} {rate / 1e3:.1f}k {4 * 4096 / rate * 1e3:.1f} "
      f"{steps[-1]['mem_gib']:.1f} mfu {100 * mfu:.1f}%{power}")
PY
  rm -rf "$dir"
done
