#!/usr/bin/env bash
# launch/bench/trace_step.sh — a timeline of `fathom train` through the CUPTI injection
# library (launch/tools/kernel_trace.c), then where the GPU waited in the last whole step but
# one and what each kernel took (launch/bench/trace_gaps.py). From the repository root on a
# GPU machine, with build/ and .gpu-libs/ made by launch/bench/gpu_bundle.sh.
#   launch/bench/trace_step.sh [LAYERS] [RESIDUAL] [STEPS]   (default 8 standard 4)
# SHAPE=8b (default): the 8B width of launch/bench/train_8b_width.sh, LAYERS layers, RESIDUAL
# as train_8b_command.sh takes it. SHAPE=1b: the 1B step of `fathom bench` (d 1280, 36
# layers, 16/8 heads of 80, ffn 5120, 4 microbatches of 8 x 1024 tokens; LAYERS ignored),
# RESIDUAL standard, mhar (replace, blocks of 4 layers, H 8), msar (the same, 4 streams of
# kernels 1 2 4 8), mhar_delta or msar_delta (the same as grafts: the delta form).
# Another build: TRACE_BINARY (default build/fathom; with FATHOM_CUDA_MODULE for its module)
# and TAG (a word in the trace's file name); AGAINST=TRACE.csv compares this step's kernels
# with another run's (trace_gaps.py --against): what moved between two builds.
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:-8}
residual=${2:-standard}
steps=${3:-4}
out=${OUT:-/tmp/trace-step}
mkdir -p "$out"
. launch/bench/gpu_env.sh
library=$PWD/build/launch/libfathom-kernel-trace.so
[ -f "$library" ] || { echo "no $library (a build without CUPTI)"; exit 1; }
. launch/bench/train_8b_command.sh
dir=/tmp/trace-step-run
binary=${TRACE_BINARY:-build/fathom}
if [ "${SHAPE:-8b}" = 1b ]; then
  msar=(--set residual.mode=msar --set residual.heads=8 --set residual.streams=4
        --set "residual.stream_kernels=[1, 2, 4, 8]")
  case $residual in
    standard) routing=(--set residual.mode=standard) ;;
    mhar) routing=(--set residual.mode=attnres --set residual.heads=8) ;;
    msar) routing=("${msar[@]}") ;;
    mhar_delta) routing=(--set residual.mode=attnres --set residual.heads=8
                         --set residual.form=delta) ;;
    msar_delta) routing=("${msar[@]}" --set residual.form=delta) ;;
    *) echo "unknown residual $residual at SHAPE=1b (standard, mhar, msar, mhar_delta," \
            "msar_delta)"; exit 2 ;;
  esac
  . launch/bench/model_1b.sh
  train_8b=("$binary" train launch/configs/demo.yaml --set run_dir="$dir" --set device=cuda
    "${model_1b[@]}" --set train.microbatch_size=8
    --set train.global_batch_size=32 --set train.steps="$steps" --set log.every=1
    --set residual.granularity=block --set residual.layers_per_block=4
    --set residual.form=replace "${routing[@]}" --set checkpoint.every=0
    --set checkpoint.save_final=false --set eval.every=0)
  layers=36
else
  train_8b_command "$binary" "$dir" "$layers" "$steps" "$residual" || exit 2
fi
rm -rf "$dir"
trace=$out/trace-${TAG:+$TAG-}$residual-$layers.csv
CUDA_INJECTION64_PATH=$library FATHOM_TRACE=$trace "${train_8b[@]}" >"$out/train.log" 2>&1 ||
  { echo "fathom train: exit $? (see $out/train.log)"; tail -3 "$out/train.log"; exit 1; }
grep -h '"step"' "$dir/metrics.jsonl" | tail -2
rm -rf "$dir"
# 4 microbatches a step open with an embedding forward each (the delta form launches a
# second a microbatch: the null source's rows)
every=4
case $residual in *delta) every=8 ;; esac
python3 launch/bench/trace_gaps.py "$trace" --marker embedding_forward --every $every \
  ${AGAINST:+--against "$AGAINST"}
echo "trace: $trace"
