#!/usr/bin/env bash
# launch/test.sh — set up, build, and run the whole test suite (one Criterion binary).
# GPU tests report SKIP on a machine without a GPU. Extra arguments go to Criterion
# (e.g. --filter 'config/*').
#
# Criterion's runner starts each test in a process of its own; on rare runs it fails to start
# one and aborts with "Could not spawn test instance: Protocol error", before any test has
# failed. The suite then runs once more, saying so; a test that fails fails the run as
# always. (One cause is known and closed: a build older than its tree, which the README walk
# rebuilt under the running suite; tests/test_readme.c now stops on it, and this script
# builds first.)
set -euo pipefail
cd "$(dirname "$0")/.."
launch/setup.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
build/tests/fathom-tests --jobs="$(nproc)" "$@" 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ] && grep -q "Could not spawn test instance" "$log" &&
   ! grep -q "^\[FAIL\]" "$log"; then
  echo "launch/test.sh: Criterion could not start a test process and stopped (no test" \
       "failed); running the suite once more" >&2
  status=0
  build/tests/fathom-tests --jobs="$(nproc)" "$@" || status=$?
fi
exit "$status"
