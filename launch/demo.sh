#!/usr/bin/env bash
# launch/demo.sh — set up, build, and train the demo model on the synthetic corpus, as the
# distributed runtime runs it: 4 ranks under mpirun (2 pipeline stages x 2 data-parallel
# ranks with FSDP, the interleaved schedule), Block MHAR from scratch. A few minutes on 2
# cores; then the bytes each stage sent, beside the prediction. Metrics land in
# runs/demo/metrics.jsonl. Extra arguments go to `fathom train` (e.g. --set train.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
launch/setup.sh
rm -rf runs/demo
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# one OpenMP thread a rank: the 4 ranks share the machine's cores
OMP_NUM_THREADS=1 mpirun --oversubscribe -np 4 \
  build/fathom train launch/configs/demo_distributed.yaml "$@"
exec build/fathom inspect --comm runs/demo
