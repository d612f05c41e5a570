#!/usr/bin/env bash
# launch/bench/trace_step.sh — a timeline of `fathom train` at the 8B width (the
# configuration of launch/bench/train_8b_width.sh) through the CUPTI injection library
# (launch/tools/kernel_trace.c), then where the GPU waited in the last whole step but one
# (launch/bench/trace_gaps.py). From the repository root on a GPU machine, with build/ and
# .gpu-libs/ made by launch/bench/gpu_bundle.sh.
#   launch/bench/trace_step.sh [LAYERS] [RESIDUAL] [STEPS]   (default 8 standard 4)
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:-8}
residual=${2:-standard}
steps=${3:-4}
out=${OUT:-/tmp/trace-step}
mkdir -p "$out"
. launch/bench/gpu_env.sh
library=$PWD/build/launch/libfathom-kernel-trace.so
[ -f "$library" ] || { echo "no $library (a build without CUPTI)"; exit 1; }
. launch/bench/train_8b_command.sh
dir=/tmp/trace-step-run
train_8b_command build/fathom "$dir" "$layers" "$steps" "$residual" || exit 2
rm -rf "$dir"
trace=$out/trace-$residual-$layers.csv
CUDA_INJECTION64_PATH=$library FATHOM_TRACE=$trace "${train_8b[@]}" >"$out/train.log" 2>&1 ||
  { echo "fathom train: exit $? (see $out/train.log)"; tail -3 "$out/train.log"; exit 1; }
grep -h '"step"' "$dir/metrics.jsonl" | tail -2
rm -rf "$dir"
# 4 microbatches a step open with an embedding forward each
python3 launch/bench/trace_gaps.py "$trace" --marker embedding_forward --every 4
