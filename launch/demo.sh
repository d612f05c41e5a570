#!/usr/bin/env bash
# launch/demo.sh — set up, build, and train the demo model on the synthetic corpus
# (a couple of minutes on 2 cores). Metrics land in runs/demo/metrics.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
launch/setup.sh
rm -rf runs/demo
exec build/fathom train launch/configs/demo.yaml "$@"
