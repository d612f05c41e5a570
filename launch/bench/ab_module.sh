#!/usr/bin/env bash
# launch/bench/ab_module.sh — two builds of the CUDA module on the same GPU in the same run:
# the routing bench (route) and `fathom train` at the 8B width (launch/bench/train_8b_width.sh)
# with each module in turn, ROUNDS times (default 2), so that clock and thermal drift fall on
# both alike. From the repository root on a GPU machine, with build/ and .gpu-libs/ made by
# launch/bench/gpu_bundle.sh.
#   launch/bench/ab_module.sh OLD_MODULE [LAYERS] [RESIDUAL ...]
# OLD_MODULE: a libfathom_cuda.so (or .so.xz) built from another commit; the new one is
# build/kernels/libfathom_cuda.so. LAYERS default 8; RESIDUAL default mhar_delta, and standard
# is timed with the new module each round as the reference. Prints "tag residual layers tok/s
# step_ms mem_gib" lines and the (c) rows; logs in $OUT (or /tmp/ab-module).
# OLD_BINARY names the old side's fathom (default build/fathom: a module built from a commit
# whose op table differs from the binary's needs its own binary). OLD_MODULE "same" times
# the new module on both sides; NEW_ENV and OLD_ENV ("NAME=value ...")
# are set for their side only, so one build's two kernel choices can be compared the same way:
#   NEW_ENV=FATHOM_ROUTE_BLOCK=mma OLD_ENV=FATHOM_ROUTE_BLOCK=simt ab_module.sh same
set -uo pipefail
cd "$(dirname "$0")/../.."
old=${1:?old module}
layers=${2:-8}
shift $(($# < 2 ? $# : 2))
residuals=("$@")
[ ${#residuals[@]} -eq 0 ] && residuals=(mhar_delta)
out=${OUT:-/tmp/ab-module}
mkdir -p "$out"
. launch/bench/gpu_env.sh
new=$PWD/build/kernels/libfathom_cuda.so
[ "$old" = same ] && old=$new
if [[ $old == *.xz ]]; then
  xz -dc "$old" >"$out/old-module.so" || exit 1
  old=$out/old-module.so
fi
for round in $(seq "${ROUNDS:-2}"); do
  for side in new old; do
    module=$new side_env=${NEW_ENV:-} binary=build/fathom
    [ $side = old ] && module=$old side_env=${OLD_ENV:-} binary=${OLD_BINARY:-build/fathom}
    env $side_env FATHOM_CUDA_MODULE=$module "$binary" bench --device cuda --cases route --repeat 10 \
      --json "$out/route-$side-$round.jsonl" >"$out/route-$side-$round.txt" 2>&1
    python3 -c "
import json, sys
for line in open(sys.argv[1]):
    if line.startswith('{'):
        r = json.loads(line)
        print(f\"$side-$round route {r['mode']:<18} {r['ms']:.2f} ms\")" "$out/route-$side-$round.jsonl"
    list=("${residuals[@]}")
    [ $side = new ] && list=(standard "${residuals[@]}")
    env $side_env FATHOM_CUDA_MODULE=$module FATHOM_BINARY=$binary OUT=$out TRAIN_TAG=$side-$round \
      launch/bench/train_8b_width.sh "$layers" 5 "${list[@]}"
  done
done
