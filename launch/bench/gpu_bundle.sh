#!/usr/bin/env bash
# launch/bench/gpu_bundle.sh — on the build machine: build, then copy the shared libraries
# the binaries need that a CUDA machine lacks (Criterion, libyaml, HDF5, ...) into
# .gpu-libs/ (git-ignored), so build/ and .gpu-libs/ can travel to a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
# meson 1.0 does not ask nvcc for dependency files, so a build directory configured without
# launch/tools/nvcc-depfile (launch/setup.sh uses it) misses edits to CUDA headers:
# recompile every .cu when a header the CUDA sources include (those under kernels/cuda, and
# the runtime/ headers they name, followed to a fixed point) is newer than the OLDEST cuda
# object. The library's own date is not enough: one rebuilt .cu makes it new while the
# others stay stale.
objects=build/kernels/libfathom_cuda.so.p
oldest=$(ls -tr "$objects"/*.o 2>/dev/null | head -1)
cuda_headers() {
  local seen=" " next
  local files=(kernels/cuda/*.cu kernels/cuda/*.h kernels/cuda/*.cuh)
  while [ ${#files[@]} -gt 0 ]; do
    next=()
    for header in $(grep -ho '#include "runtime/[a-z_]*\.h"' "${files[@]}" 2>/dev/null |
                    sed 's/#include "\(.*\)"/\1/' | sort -u); do
      case "$seen" in *" $header "*) continue ;; esac
      seen="$seen$header "
      next+=("$header")
    done
    files=("${next[@]}")
  done
  echo kernels/cuda/*.h kernels/cuda/*.cuh $seen
}
# (a build directory made by launch/setup.sh compiles through nvcc-depfile: ninja already
# knows which .cu files include an edited header, and nothing needs touching)
if ! grep -q nvcc-depfile build/build.ninja 2>/dev/null && [ -n "$oldest" ] &&
   [ -n "$(find $(cuda_headers) -newer "$oldest" 2>/dev/null)" ]; then
  touch kernels/cuda/*.cu
fi
ninja -C build
rm -rf .gpu-libs
bundle=${FATHOM_BUNDLE_LIBS:-../shared/tools/bundle-libs}
binaries=(build/fathom build/tests/fathom-tests build/kernels/libfathom_cuda.so
          build/tests/fathom-device-comm-probe)
for extra in build/kernels/fathom-route-bench build/kernels/fathom-kernel-bench \
             build/launch/libfathom-kernel-trace.so; do
  [ -x "$extra" ] && binaries+=("$extra")
done
# h5diff compares checkpoints in the tests; the GPU machine has no HDF5 tools
binaries+=("$(command -v h5diff)")
"$bundle" .gpu-libs "${binaries[@]}"
mkdir -p .gpu-libs/bin
cp "$(command -v h5diff)" .gpu-libs/bin/
# the module travels in build/kernels (where fathom looks for it), not twice
rm -f .gpu-libs/libfathom_cuda.so
echo "carry: build/fathom build/tests/fathom-tests build/kernels/libfathom_cuda.so" \
     "build/kernels/fathom-route-bench build/kernels/fathom-kernel-bench" \
     "build/tests/fathom-device-comm-probe .gpu-libs" \
     "(and build/launch/libfathom-kernel-trace.so for launch/bench/trace_step.sh)"
