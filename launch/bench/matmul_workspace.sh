#!/usr/bin/env bash
# launch/bench/matmul_workspace.sh — what cuBLASLt's workspace costs and buys, on one GPU:
# the same runs with FATHOM_MATMUL_WORKSPACE_MIB at 32 (the default) and at each size given,
# alternating, ROUNDS times: `fathom bench --cases layers` ((a): 4 Llama-3-8B layers,
# forward + backward) and launch/bench/train_8b_width.sh 8 6 standard (the 8-layer step of
# issue 13's MFU). cuBLASLt sets a flag in its workspace before most products (a memset a
# product, docs/performance.md, 2026-12-02 tenth run); with 0 it may only take algorithms
# that need none. Prints one line a run, then a table of medians.
#   launch/bench/matmul_workspace.sh [ROUNDS] [MIB ...]      (default: 2 rounds, 0 MiB)
# From the repository root with build/ and .gpu-libs/ (launch/bench/gpu_bundle.sh); logs in
# $OUT (or /tmp/matmul-workspace).
set -uo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
shift $(($# > 0 ? 1 : 0))
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(0)
out=${OUT:-/tmp/matmul-workspace}
mkdir -p "$out"
. launch/bench/gpu_env.sh
export FATHOM_CUDA_MODULE=$PWD/build/kernels/libfathom_cuda.so
: >"$out/results.txt"
for round in $(seq "$rounds"); do
  for mib in 32 "${sizes[@]}"; do
    layers=$(FATHOM_MATMUL_WORKSPACE_MIB=$mib build/fathom bench --cases layers --repeat 20 \
      2>&1 | awk '/^layers / {print $3}')
    step=$(FATHOM_MATMUL_WORKSPACE_MIB=$mib OUT=$out TRAIN_TAG=ws$mib \
      launch/bench/train_8b_width.sh 8 6 standard | awk '{print $5}')
    echo "round $round, workspace $mib MiB: layers ${layers:-?} ms, 8-layer step ${step:-?} ms" \
      | tee -a "$out/results.txt"
  done
done
echo
echo "=== medians over $rounds rounds"
python3 - "$out/results.txt" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+, workspace (\d+) MiB: layers ([\d.?]+) ms, 8-layer step ([\d.?]+) ms", line)
    if m and "?" not in m.group(2) + m.group(3):
        runs.setdefault(int(m.group(1)), []).append((float(m.group(2)), float(m.group(3))))
print(f"{'workspace':>10} {'(a) layers ms':>14} {'8-layer step ms':>16}")
for mib, values in sorted(runs.items(), reverse=True):
    print(f"{mib:>7} MiB {statistics.median(v[0] for v in values):>14.2f} "
          f"{statistics.median(v[1] for v in values):>16.1f}")
PY
