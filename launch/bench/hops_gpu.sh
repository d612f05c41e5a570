#!/usr/bin/env bash
# launch/bench/hops_gpu.sh — on a GPU machine, from the repository root, with build/ and
# .gpu-libs/ made on the build machine by launch/bench/gpu_bundle.sh: the checks of the
# pipeline's hop links that need a GPU, then a short table.
#   - tests/test_cuda_device_comm.c: hops to itself (copies on the compute stream), through
#     a one-rank NCCL communicator (ncclSend and ncclRecv in one group), between two ranks
#     sharing the GPU (host-staged); every message as it was at its send;
#   - tests/test_cuda_pipeline.c: one stage of two chunks through NCCL equal to copies bit
#     for bit; pp2 v2 and pp2 x dp2 with ranks sharing the GPU follow one rank.
# Arguments, if any, replace the test filters. A few minutes on one H200. Logs in $OUT (or
# /tmp/hops-gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/hops-gpu}
mkdir -p "$out"
export PATH=$PWD/.gpu-libs/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.gpu-libs:$PWD/build/kernels${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export FATHOM_BINARY=$PWD/build/fathom FATHOM_SOURCE_DIR=$PWD \
  FATHOM_CUDA_MODULE=$PWD/build/kernels/libfathom_cuda.so \
  FATHOM_DEVICE_COMM_PROBE=$PWD/build/tests/fathom-device-comm-probe
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=('cuda_device_comm/*' 'cuda_pipeline/hops*'
                                     'cuda_pipeline/pp2_v2*' 'cuda_pipeline/pp2_dp2*')
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
: >"$out/tests.log"
for filter in "${filters[@]}"; do
  timeout 300 build/tests/fathom-tests --jobs=1 --verbose=1 --filter "$filter" \
    >>"$out/tests.log" 2>&1
  echo "fathom-tests --filter '$filter': exit $?" >>"$out/tests.log"
done
echo
echo "=== details (full log: $out/tests.log)"
grep -E "relative loss deviation|Assertion|\[FAIL\]|exit [1-9]" "$out/tests.log" | head -40
echo
echo "=== hop GPU checks"
printf '%-6s %-9s %s\n' result seconds test
grep -E "^\[(PASS|FAIL|SKIP|ERR )\]" "$out/tests.log" | grep -v "is disabled" \
  | sed -E 's/^\[(....?)\] ([^:]+::[^:]+)(: \(([0-9.]+)s\))?.*/\1|\4|\2/' \
  | awk -F'|' '{printf "%-6s %-9s %s\n", $1, $2, $3}'
