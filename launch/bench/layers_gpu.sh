#!/usr/bin/env bash
# launch/bench/layers_gpu.sh — (a), 4 Llama-3-8B layers forward + backward, kernel by kernel:
# fathom against torch.compile in the same run. On a GPU machine, from the repository root,
# with build/ and .gpu-libs/ made by launch/bench/gpu_bundle.sh; builds nothing, about 3
# minutes.
#   1. fathom-kernel-bench's matmuls at the layer's shapes: forward, backward, and the weight
#      gradient alone, added into its fp32 accumulator or written; with RANKS="0 1 2",
#      each of cuBLASLt's candidates of those ranks (FATHOM_MATMUL_RANK);
#   2. `fathom bench --cases layers` timed, then traced (launch/tools/kernel_trace.c): each
#      kernel's time over 10 passes (launch/bench/trace_gaps.py);
#   3. peer.py's layers case with --profile: each kernel's time a step under torch.compile
#      and eager, and PyTorch's bf16 weight-gradient products at the same shapes.
# OLD_BINARY / OLD_MODULE: a second build's `fathom bench --cases layers`, timed in the same
# run. Logs go to $OUT (or /tmp/layers-gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/layers-gpu}
mkdir -p "$out"
. launch/bench/gpu_env.sh
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv,noheader

stamp "1. matmuls (fathom-kernel-bench matmul), cuBLASLt's candidates of ranks ${RANKS:-0}"
for rank in ${RANKS:-0}; do
  echo "FATHOM_MATMUL_RANK=$rank"
  FATHOM_MATMUL_RANK=$rank timeout 120 build/kernels/fathom-kernel-bench matmul 2>&1 |
    grep -E "matmul" | tee "$out/kernel-bench-$rank.log"
done

stamp "2. fathom bench --cases layers"
timeout 120 build/fathom bench --cases layers --repeat 20 2>&1 | tee "$out/bench.log" |
  grep -E "layers"
if [ -n "${OLD_BINARY:-}" ]; then
  FATHOM_CUDA_MODULE=${OLD_MODULE:-} timeout 120 "$OLD_BINARY" bench --cases layers --repeat 20 \
    2>&1 | tee "$out/bench-old.log" | grep -E "layers" | sed 's/^/old: /'
  timeout 120 build/fathom bench --cases layers --repeat 20 2>&1 | grep -E "layers" |
    sed 's/^/again: /'
fi
library=$PWD/build/launch/libfathom-kernel-trace.so
if [ -f "$library" ]; then
  CUDA_INJECTION64_PATH=$library FATHOM_TRACE=$out/trace.csv timeout 120 \
    build/fathom bench --cases layers --repeat 20 >"$out/bench-traced.log" 2>&1
  python3 launch/bench/trace_gaps.py "$out/trace.csv" --marker embedding_forward --every 10 \
    --top 30 | tee "$out/trace.txt" | tail -34
fi

stamp "3. PyTorch (peer.py layers --profile)"
timeout 300 python3 launch/bench/peer.py --cases layers --profile --repeat 20 2>&1 |
  grep -vE "Warning|warn" | tee "$out/peer.log" | tail -80
stamp done
