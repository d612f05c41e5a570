#!/usr/bin/env bash
# launch/bench/job_8b.sh — the 8B Block-MHAR mid-training job (launch/configs/
# marin8b_block_mhar.yaml: pp 2 x dp 4, interleaved with the cross-stage cache, FSDP,
# activation checkpointing, EMA, z-loss, AdamW, HDF5 checkpoints) on one node of eight GPUs,
# from the repository root with build/ and .gpu-libs/ made by launch/bench/gpu_bundle.sh:
#
#   1. a random-weight Llama-3.1-8B written as Hugging Face safetensors (make_hf_8b.py) and
#      imported with `fathom convert` as the delta graft's step 0;
#   2. run A: STEPS steps from step 0 on eight ranks (synthetic data), saving nothing;
#   3. run B: from the same step 0, STEPS / 2 steps and a checkpoint, then resumed to STEPS
#      (one checkpoint of the 8B job is about 130 GB: model, EMA and both moments in fp32;
#      the disk holds the import, step 0 and that one);
#   4. the report: tokens/s a GPU and MFU (the mean of A's steps after the first), the peak
#      memory of every GPU (nvidia-smi, sampled through A), pp and FSDP bytes a stage beside
#      the prediction (`fathom inspect --comm` on A), each stage's communication time and
#      its exposed share of the step (A's closing table), the checkpoint's save and load
#      times, and whether B's steps after the resume equal A's bit for bit (loss and
#      gradient norm of every step).
#
#   launch/bench/job_8b.sh [STEPS] [--set key=value ...]      (STEPS even, default 10)
#
# DEVICE=cpu rehearses it all on the cpu at a tiny width (8 ranks on host memory, no
# import), which is how the script itself is tested (tests/test_fsdp.c). Logs and runs go
# to $OUT (or /tmp/job-8b); the import needs about 16 GB of disk there.
set -uo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-10}
shift $(($# > 0 ? 1 : 0))
extra=("$@")
if [ $((steps % 2)) -ne 0 ] || [ "$steps" -lt 2 ]; then
  echo "job_8b.sh: STEPS must be even and at least 2" >&2
  exit 2
fi
half=$((steps / 2))
out=${OUT:-/tmp/job-8b}
device=${DEVICE:-cuda}
binary=${FATHOM_BINARY:-build/fathom}
config=launch/configs/marin8b_block_mhar.yaml
job=$out/job
mkdir -p "$out"
rm -rf "$job"
launcher=(mpirun --oversubscribe -np 8)
common=(--set data.source=synthetic --set checkpoint.every=0 --set checkpoint.keep_last=1
        --set log.every=1 --set eval.every=0 --set optim.warmup_steps=2)
if [ "$device" = cuda ]; then
  . launch/bench/gpu_env.sh
  export FATHOM_CUDA_MODULE=$PWD/build/kernels/libfathom_cuda.so
  launcher+=(-x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x FATHOM_CUDA_MODULE)
  gpus=$(nvidia-smi --list-gpus | wc -l)
  if [ "$gpus" -lt 8 ]; then
    echo "job_8b.sh: $gpus GPUs here; the job takes eight (DEVICE=cpu rehearses it)" >&2
    exit 2
  fi
  echo "== step 0: a random-weight Llama-3.1-8B, imported as the delta graft"
  if [ ! -f "$out/hf/config.json" ]; then
    python3 launch/bench/make_hf_8b.py "$out/hf" 2>&1 | tail -1
  fi
  sed -e 's/source: shards/source: synthetic/' "$config" >"$out/job.yaml"
  "$binary" convert --from-hf "$out/hf" --config "$out/job.yaml" --to "$job" \
    >"$out/convert.log" 2>&1
  echo "convert: exit $? ($(tail -1 "$out/convert.log"))"
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  common+=(--set device=cpu --set model.vocab_size=256 --set model.d_model=32
           --set model.n_heads=4 --set model.n_kv_heads=2 --set model.head_dim=8
           --set model.ffn_dim=64 --set train.seq_len=16 --set train.microbatch_size=1
           --set train.global_batch_size=16)
fi

train() { # STEPS SAVE LOG: the job's run directory to STEPS, saving the last step or not
  "${launcher[@]}" "$binary" train "$config" --set run_dir="$job" --set train.steps="$1" \
    --set checkpoint.save_final="$2" "${common[@]}" "${extra[@]}" >"$3" 2>&1 </dev/null
}

sampler=
if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 \
    >"$out/gpu-memory.csv" 2>/dev/null &
  sampler=$!
fi
echo "== run A: $steps steps from step 0"
train "$steps" false "$out/A.log"
echo "run A: exit $?"
[ -n "$sampler" ] && kill "$sampler" 2>/dev/null
cp "$job/metrics.jsonl" "$out/A-metrics.jsonl" 2>/dev/null
"$binary" inspect --comm "$job" >"$out/comm.log" 2>&1
echo "inspect --comm: exit $?"
echo "== run B: $half steps from step 0 and a checkpoint, then resumed to $steps"
train "$half" true "$out/B1.log"
echo "run B, first half: exit $?"
train "$steps" false "$out/B2.log"
echo "run B, resumed: exit $?"

echo
echo "=== the 8B job on $device ($steps steps; B resumed at step $half)"
python3 - "$out" "$half" <<'PY'
import json, re, sys
from pathlib import Path
out, half = Path(sys.argv[1]), int(sys.argv[2])

def steps(path):
    try:
        return [json.loads(l) for l in open(path) if '"loss"' in l]
    except OSError:
        return []

a, b = steps(out / "A-metrics.jsonl"), steps(out / "job" / "metrics.jsonl")
steady = a[1:] or a
if steady:
    mean = lambda key: sum(l[key] for l in steady if l[key] is not None) / len(steady)
    mfu = f"{100 * mean('mfu'):.1f}%" if steady[0]["mfu"] is not None else "-"
    print(f"tokens/s a GPU   {mean('tokens_per_s_per_device'):.0f} (MFU {mfu}), "
          f"rank 0's peak {max(l['mem_gib'] for l in a):.1f} GiB")
else:
    print("run A logged no step")
memory = out / "gpu-memory.csv"
if memory.exists():
    peaks = {}
    for line in memory.read_text().splitlines():
        index, used = (field.strip() for field in line.split(","))
        peaks[index] = max(peaks.get(index, 0), int(used))
    print("peak memory      " + ", ".join(f"GPU {i} {mib / 1024:.1f} GiB"
                                          for i, mib in sorted(peaks.items())))
log = (out / "A.log").read_text(errors="replace")
for line in re.findall(r"fathom: saved step .*", (out / "B1.log").read_text(errors="replace")):
    print("save             " + line.removeprefix("fathom: "))
for line in re.findall(r"fathom: loaded .*", (out / "B2.log").read_text(errors="replace")):
    print("load             " + line.removeprefix("fathom: "))
comm = (out / "comm.log").read_text(errors="replace")
print("bytes            " + ("every measured value equals the prediction"
                             if "every measured value equals the prediction" in comm
                             else "DIFFERENT from the prediction (comm.log)"))
table = log[log.find("fathom: communication a step"):].splitlines()[:4]
for line in table:
    print("                 " + line)
later = {l["step"]: (l["loss"], l["grad_norm"]) for l in a if l["step"] > half}
resumed = {l["step"]: (l["loss"], l["grad_norm"]) for l in b if l["step"] > half}
same = bool(later) and later == resumed
print(f"resume           {'bitwise' if same else 'NOT bitwise'} (loss and gradient norm of "
      f"steps {half + 1}-{max(later, default=half)}: {'equal' if same else 'differ'})")
PY
