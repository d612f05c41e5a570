#!/usr/bin/env bash
# launch/bench/profile_attention.sh — on a GPU machine with ncu, from the repository root,
# with build/ and .gpu-libs/ made by launch/bench/gpu_bundle.sh: Nsight Compute's speed of
# light, occupancy, warp states and launch statistics for the default attention kernels at
# one head_dim of fathom-kernel-bench's shapes (the fifth launch of each: past the
# warm-ups), about a minute. docs/performance.md records what it said.
#   launch/bench/profile_attention.sh [HEAD_DIM]   (128: B1 T4096 32/8; 80: the 1B shape
#                                                   B32 T1024 16/8, the default; 64)
set -uo pipefail
cd "$(dirname "$0")/../.."
. launch/bench/gpu_env.sh
head_dim=${1:-80}
out=${OUT:-/tmp/profile-attention}
mkdir -p "$out"
[ -n "$FATHOM_NCU" ] || { echo "no ncu on this machine"; exit 1; }
for pair in "persistent attention_forward_specialised_kernelILi${head_dim}E" \
            "fused_tma attention_backward_fused_kernelILi${head_dim}E"; do
  variant=${pair%% *} kernel=${pair#* }
  timeout 120 "$FATHOM_NCU" --clock-control none --kernel-name-base mangled \
    --kernel-name "regex:$kernel" --launch-skip 4 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis \
    build/kernels/fathom-kernel-bench attention "$variant" >"$out/$variant-$head_dim.txt" 2>&1
  echo "== $variant, head_dim $head_dim (exit $?)"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|Issued Ipc|Warp Cycles Per Issued|Block Limit" \
    "$out/$variant-$head_dim.txt" | head -20
done
