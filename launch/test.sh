#!/usr/bin/env bash
# launch/test.sh — set up, build, and run the whole test suite (one Criterion binary).
# GPU tests report SKIP on a machine without a GPU. Extra arguments go to Criterion
# (e.g. --filter 'config/*').
set -euo pipefail
cd "$(dirname "$0")/.."
launch/setup.sh
exec build/tests/fathom-tests --jobs="$(nproc)" "$@"
