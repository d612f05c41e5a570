#!/usr/bin/env bash
# launch/bench/devcomm_gpu.sh — on a GPU machine, from the repository root, with build/ and
# .gpu-libs/ made on the build machine by launch/bench/gpu_bundle.sh: the checks of device
# communication, the pipeline's hops and rank placement that need a GPU, then a short table.
#   - tests/test_cuda_device_comm.c: NCCL in the CUDA module on a one-rank communicator (init,
#     all-gather, reduce-scatter, the communication stream after the compute stream, the
#     deadline that aborts a work), two ranks sharing the GPU (host-staged, exact; and forced
#     onto NCCL: exit 5 from its init); hops to itself (copies on the compute stream),
#     through a one-rank NCCL communicator (ncclSend and ncclRecv in one group), between two
#     ranks sharing the GPU; every message as it was at its send;
#   - tests/test_cuda_pipeline.c: one stage of two chunks with its hops through NCCL equal to
#     copies bit for bit; pp2, pp2 v2 and pp2 x dp2 with ranks sharing the GPU follow one rank;
#   - tests/test_cuda_topo.c: `fathom train` under mpirun: bound near the GPU, ranks sharing
#     it, a launcher's binding kept;
#   - the cuda op table has every entry (event_wait included);
#   - `fathom bench --cases comm` on two ranks sharing the GPU (host-staged).
# Arguments, if any, replace the test filters. A few minutes on one H200. Logs in $OUT (or
# /tmp/devcomm-gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/devcomm-gpu}
mkdir -p "$out"
. launch/bench/gpu_env.sh
export FATHOM_CUDA_MODULE=$PWD/build/kernels/libfathom_cuda.so \
  FATHOM_DEVICE_COMM_PROBE=$PWD/build/tests/fathom-device-comm-probe
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for library in $(ldd build/kernels/libfathom_cuda.so | awk '/libnccl/ {print $3}'); do
  echo "NCCL: $library" | tee -a "$out/gpu.txt"
done
: >"$out/tests.log"
filters=("$@")
[ ${#filters[@]} -gt 0 ] || filters=('cuda_device_comm/*' 'cuda_pipeline/hops*'
  'cuda_pipeline/pp2*' 'cuda_topo/*' 'cuda_backend/fills_every_entry*')
for filter in "${filters[@]}"; do
  timeout 300 build/tests/fathom-tests --jobs=1 --verbose=1 --filter "$filter" \
    >>"$out/tests.log" 2>&1
  echo "fathom-tests --filter '$filter': exit $?" >>"$out/tests.log"
done
# the comm bench on two ranks sharing the GPU (host-staged): a smoke test of the case that a
# machine of several GPUs times through NCCL (launch/bench/gpus_nccl.sh bandwidth)
timeout 300 mpirun --oversubscribe -np 2 -x LD_LIBRARY_PATH -x FATHOM_CUDA_MODULE \
  build/fathom bench --cases comm --repeat 3 >"$out/bench-comm.log" 2>&1
echo "fathom bench --cases comm on 2 ranks sharing the GPU: exit $?" >>"$out/tests.log"
echo
echo "=== details (full log: $out/tests.log)"
grep -E "^cuda_topo: |relative loss deviation|Assertion|\[FAIL\]|exit [1-9]" "$out/tests.log" \
  | head -40
echo
echo "=== devcomm GPU checks"
printf '%-6s %-9s %s\n' result seconds test
grep -E "^\[(PASS|FAIL|SKIP|ERR )\]" "$out/tests.log" | grep -v "is disabled" \
  | sed -E 's/^\[(....?)\] ([^:]+::[^:]+)(: \(([0-9.]+)s\))?.*/\1|\4|\2/' \
  | awk -F'|' '{printf "%-6s %-9s %s\n", $1, ($2 == "" ? "-" : $2), $3}'
echo
echo "=== fathom bench --cases comm, 2 ranks on one GPU (host-staged)"
grep -E "^bench: comm over|^comm " "$out/bench-comm.log"
