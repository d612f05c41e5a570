#!/usr/bin/env bash
# launch/bench/checkpoint_1b.sh — start-up, save and load of the 1.2B model of the
# performance table (d 1280, 36 layers, 16/8 heads of 80, ffn 5120, vocab 128256) on one
# GPU, beside a dd write of the same size to the same disk, in one run:
#   1. a fresh run of one step: the set-up time (process start to the first step) and the
#      save of step 1 (19 GB: model, EMA, two moments);
#   2. the same run resumed to step 2: the load of step 1 and its set-up time;
#   3. dd of as many bytes as the checkpoint, fsync'd, to the same directory.
#   launch/bench/checkpoint_1b.sh [RUN_ROOT]
# FATHOM_BINARY names the binary (default build/fathom); logs go to $OUT (or /tmp). The
# last lines are a short table.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=${1:-/tmp/checkpoint-1b}
binary=${FATHOM_BINARY:-build/fathom}
out=${OUT:-/tmp}
rm -rf "$root"
mkdir -p "$root"
. launch/bench/model_1b.sh
model=("${model_1b[@]}" --set train.microbatch_size=8 --set train.global_batch_size=8 --set log.every=1 --set checkpoint.every=1
       --set eval.every=0 --set device=cuda --set run_dir="$root/run")
"$binary" train launch/configs/demo.yaml "${model[@]}" --set train.steps=1 \
  >"$out/checkpoint-1b-save.log" 2>&1
echo "exit $? (fresh run, one step)"
"$binary" train launch/configs/demo.yaml "${model[@]}" --set train.steps=2 \
  >"$out/checkpoint-1b-load.log" 2>&1
echo "exit $? (resumed to step 2)"
bytes=$(du -sb "$root/run/checkpoints/step_00000001" | cut -f1)
sync
start=$(date +%s.%N)
dd if=/dev/zero of="$root/dd.bin" bs=64M count=$(( (bytes + 67108863) / 67108864 )) \
  conv=fsync status=none
end=$(date +%s.%N)
rm -f "$root/dd.bin"
echo "== checkpoint of the 1.2B model ($bytes bytes on disk)"
grep -h "ready to train\|saved step\|loaded " "$out/checkpoint-1b-save.log" \
  "$out/checkpoint-1b-load.log"
python3 -c "import sys; s = float(sys.argv[2]) - float(sys.argv[1]); \
print(f'dd of the same size, fsync\'d: {s:.2f} s ({int(sys.argv[3]) / 1e9 / s:.2f} GB/s)')" \
  "$start" "$end" "$bytes"
