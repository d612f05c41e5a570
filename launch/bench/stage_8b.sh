#!/usr/bin/env bash
# launch/bench/stage_8b.sh — one pipeline stage's share of the 8B Block-MHAR job
# (launch/configs/marin8b_block_mhar.yaml: pp 2 x dp 4) on one GPU: 16 of the 32 layers of
# the 8B model, delta Block MHAR (H 8, blocks of 4 layers), activation checkpointing, 4
# microbatches of 2 x 4096 tokens a step, the whole optimizer state on the one GPU (the job
# shards it over 4). It carries both the embedding and the head, which the job splits
# between its two stages. Prints the steps' tok/s, MFU and peak memory (the mean of the
# steps after the first).
#   launch/bench/stage_8b.sh [STEPS] [--set key=value ...]
# The overrides go last, e.g. --set train.activation_checkpointing=none --set
# train.microbatch_size=1 --set train.global_batch_size=4 for the stage without recompute
# (docs/performance.md, "The 8B job's memory and traffic, planned"). FATHOM_BINARY names the
# binary (default build/fathom); logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-5}
shift $(($# > 0 ? 1 : 0))
binary=${FATHOM_BINARY:-build/fathom}
out=${OUT:-/tmp}
run=/tmp/stage-8b
rm -rf "$run"
"$binary" train launch/configs/marin8b_block_mhar.yaml --set run_dir="$run" \
  --set model.n_layers=16 --set parallel.pp=1 --set parallel.dp=1 \
  --set parallel.virtual_stages=1 --set parallel.schedule=1f1b --set data.source=synthetic \
  --set train.global_batch_size=8 --set train.steps="$steps" --set log.every=1 \
  --set checkpoint.every=0 --set checkpoint.save_final=false --set optim.warmup_steps=1 \
  "$@" >"$out/stage-8b.log" 2>&1
echo "exit $? (16 layers of the 8B model, one GPU)"
grep -E "memory plan|ready to train" "$out/stage-8b.log"
python3 - "$run/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
steady = lines[1:] or lines
mean = lambda key: sum(l[key] for l in steady) / len(steady)
print(f"stage of the 8B job on one GPU: {mean('tokens_per_s'):.0f} tok/s, "
      f"MFU {100 * mean('mfu'):.1f}%, peak {max(l['mem_gib'] for l in lines):.1f} GiB, "
      f"losses " + " ".join(f"{l['loss']:.3f}" for l in lines))
PY
