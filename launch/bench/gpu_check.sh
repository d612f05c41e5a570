#!/usr/bin/env bash
# launch/bench/gpu_check.sh — on a GPU machine, from the repository root, with build/ and
# .gpu-libs/ made on the build machine (launch/bench/gpu_bundle.sh): the CUDA kernels
# against the cpu reference, then the timings, ours and PyTorch's on the same GPU.
#   launch/bench/gpu_check.sh [tests] [bench] [route] [fathom] [peer]
#   (default: tests fathom peer; FATHOM_CASES / PEER_CASES pick the cases of the last two.
#   PyTorch's step1b runs a 1B model per mode, eager and compiled, about 7 minutes for
#   the three: run it on its own, `python3 launch/bench/peer.py --cases step1b`.)
# Logs go to $OUT (or /tmp/gpu-check); a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
. launch/bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,temperature.gpu \
  --format=csv | tee "$out/gpu.txt"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests fathom peer)
for part in "${parts[@]}"; do
  case $part in
    tests)
      build/tests/fathom-tests --jobs=4 --filter 'cuda*/*' --verbose=1 >"$out/tests.log" 2>&1
      grep -E "\[FAIL\]|Assertion|Synthesis|error|deviation|_gpu .*relative" "$out/tests.log" \
        | head -80 ;;
    bench) build/kernels/fathom-kernel-bench 2>&1 | tee "$out/bench.txt" ;;
    route) build/kernels/fathom-route-bench 2>&1 | tee "$out/route.txt" ;;
    fathom) build/fathom bench --cases "${FATHOM_CASES:-layers,attention,route,msar,step}" \
              --json "$out/fathom-bench.jsonl" 2>&1 | tee "$out/fathom-bench.txt" ;;
    peer) python3 launch/bench/peer.py --cases "${PEER_CASES:-attention,route,msar,layers}" \
            2>&1 | tee "$out/peer.txt" | grep -v "^{" ;;
    *) echo "gpu_check: unknown part $part" >&2; exit 2 ;;
  esac
done
