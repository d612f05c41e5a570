#!/usr/bin/env bash
# launch/bench/checkpointing_1b.sh — what train.activation_checkpointing: full saves and costs
# at the 1B step of the performance table (d 1280, 36 layers, 16/8 heads of 80, ffn 5120,
# vocab 128256, 4 microbatches of 8 x 1024 tokens), on one GPU: the memory plan's
# activations, the peak memory and the steady-state tokens/s (median of the steps after the
# first two), with checkpointing none and full, in one run.
#   launch/bench/checkpointing_1b.sh [STEPS]
# FATHOM_BINARY names the binary (default build/fathom); logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
binary=${FATHOM_BINARY:-build/fathom}
out=${OUT:-/tmp}
. launch/bench/model_1b.sh
for mode in none full; do
  dir=/tmp/checkpointing-1b-$mode
  rm -rf "$dir"
  "$binary" train launch/configs/demo.yaml --set run_dir="$dir" --set device=cuda \
    "${model_1b[@]}" --set train.microbatch_size=8 --set train.global_batch_size=32 --set train.steps="$steps" --set log.every=1 \
    --set train.activation_checkpointing=$mode --set checkpoint.every=0 --set eval.every=0 \
    >"$out/checkpointing-1b-$mode.log" 2>&1
  echo "exit $? ($mode)"
  grep "memory plan" "$out/checkpointing-1b-$mode.log"
  python3 - "$dir/metrics.jsonl" "$mode" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
rates = [l["tokens_per_s"] for l in lines[2:]] or [lines[-1]["tokens_per_s"]]
print(f"checkpointing {sys.argv[2]}: {statistics.median(rates):.0f} tok/s, "
      f"peak {max(l['mem_gib'] for l in lines):.1f} GiB, losses "
      + " ".join(f"{l['loss']:.4f}" for l in lines))
PY
done
