#!/usr/bin/env bash
# launch/bench/gpus_nccl.sh — data and pipeline parallelism across GPUs through NCCL, on a
# machine with two or more GPUs (a rank a GPU), from the repository root, with build/ and
# .gpu-libs/ made by launch/bench/gpu_bundle.sh. Each part prints a short table last:
#
#   gpus_nccl.sh equivalence SHAPE [RESIDUAL ...]
#       SHAPE 1b (d 1280, 36 layers, 16/8 heads of 80, FFN 5120, 32 x 1024 tokens a step) or
#       8b4 (4 layers of the 8B width, 4 x 4096 tokens); 20 steps on one GPU, then dp2, pp2
#       and pp2 v2 (interleaved, cross-stage cache) on two: the worst relative loss deviation
#       from the one-GPU run ("(FAR)" past bf16's 1e-2), the communication method, the exposed share of the step, and
#       whether `fathom inspect --comm` finds every byte as predicted. RESIDUAL: standard,
#       attnres, mhar, msar, mhar_delta, msar_delta (default: all).
#   gpus_nccl.sh overlap [RESIDUAL ...]
#       dp2 at the 1B shape, 10 steps: each kind's time and exposed time a step (the run's
#       closing table); the goal is exposed FSDP communication <= 5% of the step.
#   gpus_nccl.sh bandwidth
#       `fathom bench --cases comm` on two ranks and launch/bench/peer_comm.py (PyTorch's
#       torch.distributed) on the same GPUs: bus GB/s at fathom's unit sizes.
#   gpus_nccl.sh fault
#       dp2 at the 1B shape: rank 1 stops (a hung node) at step 3, then rank 1 is killed
#       there (mpirun --enable-recovery): rank 0 must end with exit 5 naming rank 1 within
#       parallel.timeout_s (10 s) and the roll call.
#
# DEVICE=cpu rehearses every part on the cpu at a tiny width (DESIGN 3: ranks on host
# memory through MPI), which is how the script itself is tested (tests/test_pipeline.c).
# Logs and run directories go to $OUT (or /tmp/gpus-nccl).
set -uo pipefail
cd "$(dirname "$0")/../.."
part=${1:?"equivalence SHAPE [RESIDUAL ...] | overlap [RESIDUAL ...] | bandwidth | fault"}
shift
out=${OUT:-/tmp/gpus-nccl}
device=${DEVICE:-cuda}
mkdir -p "$out"
if [ "$device" = cuda ]; then
  . launch/bench/gpu_env.sh
  export FATHOM_CUDA_MODULE=$PWD/build/kernels/libfathom_cuda.so
  gpus=$(nvidia-smi --list-gpus | wc -l)
  if [ "$gpus" -lt 2 ]; then
    echo "gpus_nccl.sh: $gpus GPU here; NCCL between ranks needs two (DEVICE=cpu rehearses)" >&2
    exit 2
  fi
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fi
binary=${FATHOM_BINARY:-build/fathom}
launcher=(mpirun --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x FATHOM_CUDA_MODULE
          -x FATHOM_FAULT)
export FATHOM_FAULT= NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} \
  FATHOM_CUDA_MODULE=${FATHOM_CUDA_MODULE:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}

# shape_keys SHAPE: the --set overrides of launch/configs/demo.yaml for the shape, in `shape`.
# Blocks divide the chunks of pp2 v2 (4 chunks: 9 layers of the 1B model, 1 of the 8b4).
shape_keys() {
  if [ "$device" = cpu ]; then
    shape=(--set model.vocab_size=256 --set model.d_model=64 --set model.n_layers=4
           --set model.n_heads=4 --set model.n_kv_heads=2 --set model.head_dim=16
           --set model.ffn_dim=128 --set train.seq_len=32 --set train.microbatch_size=2
           --set train.global_batch_size=8 --set residual.layers_per_block=1)
  elif [ "$1" = 1b ]; then
    . launch/bench/model_1b.sh
    shape=("${model_1b[@]}" --set train.microbatch_size=8 --set train.global_batch_size=32
           --set residual.layers_per_block=3)
  else
    shape=(--set model.vocab_size=128256 --set model.d_model=4096 --set model.n_layers=4
           --set model.n_heads=32 --set model.n_kv_heads=8 --set model.head_dim=128
           --set model.ffn_dim=14336 --set model.rope_theta=500000 --set train.seq_len=4096
           --set train.microbatch_size=1 --set train.global_batch_size=4
           --set residual.layers_per_block=1)
  fi
}

# residual_keys RESIDUAL: its --set overrides, in `routing`
residual_keys() {
  case $1 in
    standard) routing=(--set residual.mode=standard) ;;
    attnres) routing=(--set residual.mode=attnres --set residual.heads=1) ;;
    mhar) routing=(--set residual.mode=attnres --set residual.heads=8) ;;
    msar) routing=(--set residual.mode=msar --set residual.heads=8 --set residual.streams=4
                   --set "residual.stream_kernels=[1, 2, 4, 8]") ;;
    mhar_delta) routing=(--set residual.mode=attnres --set residual.heads=8
                         --set residual.form=delta) ;;
    msar_delta) routing=(--set residual.mode=msar --set residual.heads=8 --set residual.streams=4
                         --set "residual.stream_kernels=[1, 2, 4, 8]" --set residual.form=delta) ;;
    *) echo "unknown residual $1" >&2; return 2 ;;
  esac
  [ "$1" != standard ] && routing+=(--set residual.granularity=block)
  return 0
}

# train RANKS RUN_DIR [--set ...]: one run, its log in RUN_DIR.log; returns its exit code.
# mpirun's extra options: the array recovery (empty unless a part sets it).
recovery=()
train() {
  local ranks=$1 dir=$2
  shift 2
  rm -rf "$dir"
  local command=("$binary" train launch/configs/demo.yaml --set run_dir="$dir"
    --set device="$device" --set data.source=synthetic --set checkpoint.every=0
    --set checkpoint.save_final=false --set eval.every=0 --set log.every=1
    --set optim.warmup_steps=2 "$@")
  if [ "$ranks" -gt 1 ]; then
    "${launcher[@]}" "${recovery[@]}" -np "$ranks" "${command[@]}" >"$dir.log" 2>&1 </dev/null
  else
    "${command[@]}" >"$dir.log" 2>&1 </dev/null
  fi
}

# compare ONE MANY: the worst relative loss deviation of MANY's steps from ONE's, and
# whether it is within bf16 tolerance (1e-2, the cuda pipeline tests' bound)
compare() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    try:
        return {l["step"]: l["loss"] for l in map(json.loads, open(path)) if "loss" in l}
    except OSError:
        return {}
one, many = losses(sys.argv[1]), losses(sys.argv[2])
if not one or set(one) != set(many):
    print("missing")
else:
    worst = max(abs(many[s] - one[s]) / abs(one[s]) for s in one)
    print(f"{worst:.3g}{'' if worst <= 1e-2 else '(FAR)'}")
PY
}

# exposed_share LOG: the largest exposed share of the step in the run's closing table
exposed_share() {
  awk '/^fathom: communication a step/ {table = 1; next}
       table && $1 ~ /^[0-9]+$/ {share = $NF; sub("%", "", share); if (share > worst) worst = share}
       END {if (worst == "") print "-"; else printf "%.1f%%\n", worst}' "$1"
}

# method_of LOG: how the run's ranks communicated (FSDP's method, else the hops')
method_of() {
  grep -o -m1 "fsdp over dp groups of [0-9]* ranks: [a-z-]*\|pipeline hops: [a-z-]*" "$1" \
    | sed 's/.*: //' | head -1
}

steps=20
[ "$device" = cpu ] && steps=5
case $part in
  equivalence)
    shape_name=${1:?"equivalence SHAPE: 1b or 8b4"}
    shift
    residuals=("$@")
    [ ${#residuals[@]} -gt 0 ] || residuals=(standard attnres mhar msar mhar_delta msar_delta)
    shape_keys "$shape_name"
    layouts=("dp2|--set parallel.dp=2"
             "pp2|--set parallel.pp=2"
             "pp2v2|--set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.schedule=interleaved")
    rows=()
    for residual in "${residuals[@]}"; do
      residual_keys "$residual" || exit 2
      single=$out/$shape_name-$residual-one
      train 1 "$single" "${shape[@]}" "${routing[@]}" --set train.steps=$steps
      status=$?
      for entry in "${layouts[@]}"; do
        name=${entry%%|*}
        read -r -a keys <<<"${entry#*|}"
        dir=$out/$shape_name-$residual-$name
        train 2 "$dir" "${shape[@]}" "${routing[@]}" --set train.steps=$steps "${keys[@]}"
        code=$?
        deviation=$( [ $status -eq 0 ] && [ $code -eq 0 ] && compare "$single" "$dir" || echo "exit $status/$code")
        bytes=$("$binary" inspect --comm "$dir" 2>&1 | grep -c "every measured value equals")
        rows+=("$(printf '%-11s %-6s %-12s %-12s %-9s %s' "$residual" "$name" "$deviation" \
          "$(method_of "$dir.log")" "$(exposed_share "$dir.log")" \
          "$([ "$bytes" = 1 ] && echo as-predicted || echo DIFFERENT)")")
      done
    done
    echo
    echo "=== $shape_name on $device, $steps steps: two ranks against one"
    printf '%-11s %-6s %-12s %-12s %-9s %s\n' residual layout deviation method exposed bytes
    printf '%s\n' "${rows[@]}"
    ;;
  overlap)
    residuals=("$@")
    [ ${#residuals[@]} -gt 0 ] || residuals=(standard mhar_delta)
    shape_keys 1b
    for residual in "${residuals[@]}"; do
      residual_keys "$residual" || exit 2
      dir=$out/overlap-$residual
      train 2 "$dir" "${shape[@]}" "${routing[@]}" --set train.steps=10 --set parallel.dp=2
      echo
      echo "=== dp2, $residual (exit $?): $(grep -m1 "fsdp over dp groups" "$dir.log")"
      sed -n '/^fathom: communication a step/,$p' "$dir.log" | head -4
    done
    ;;
  bandwidth)
    small=()
    [ "$device" = cpu ] && small=(--small)
    "${launcher[@]}" -np 2 "$binary" bench --cases comm --device "$device" "${small[@]}" \
      --json "$out/bench-comm.jsonl" >"$out/bench-comm.log" 2>&1 </dev/null
    echo "fathom bench --cases comm: exit $?"
    if [ "$device" = cuda ]; then
      torchrun --standalone --nproc_per_node 2 launch/bench/peer_comm.py \
        >"$out/peer-comm.log" 2>&1
      echo "peer_comm.py: exit $?"
    fi
    echo
    echo "=== bus GB/s at fathom's unit sizes, two ranks"
    python3 - "$out/bench-comm.jsonl" "$out/peer-comm.log" <<'PY'
import json, sys
def rows(path):
    try:
        return {r["mode"]: r for r in (json.loads(l) for l in open(path) if l.startswith("{"))}
    except OSError:
        return {}
fathom, torch = rows(sys.argv[1]), rows(sys.argv[2])
print(f"{'mode':<22} {'fathom ms':>10} {'GB/s':>8} {'torch ms':>10} {'GB/s':>8} {'ratio':>6}")
for mode, row in fathom.items():
    peer = torch.get(mode)
    tail = (f"{peer['ms']:>10.3f} {peer['rate']:>8.1f} {row['rate'] / peer['rate']:>5.2f}x"
            if peer else f"{'-':>10} {'-':>8} {'-':>6}")
    print(f"{mode:<22} {row['ms']:>10.3f} {row['rate']:>8.1f} {tail}")
PY
    ;;
  fault)
    shape_keys 1b
    rows=()
    for kind in stop exit; do
      dir=$out/fault-$kind
      recovery=()
      [ $kind = exit ] && recovery=(--enable-recovery)
      started=$(date +%s.%N)
      export FATHOM_FAULT=rank=1,step=3,kind=$kind
      train 2 "$dir" "${shape[@]}" --set train.steps=6 --set parallel.dp=2 \
        --set parallel.timeout_s=10
      code=$?
      export FATHOM_FAULT=
      seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
        "$started" "$(date +%s.%N)")
      named=$(grep -o -m1 "on this host, rank 1 (pid [0-9]*) [a-z ]*" "$dir.log")
      rows+=("$(printf '%-5s %-5s %-8s %s' "$kind" "$code" "$seconds" "${named:-(rank 1 not named)}")")
      rows+=("      $(grep -m1 "fathom: error: rank 0" "$dir.log" | cut -c1-150)")
    done
    echo
    echo "=== a rank lost at step 3 of dp2 (parallel.timeout_s 10; --enable-recovery for exit)"
    printf '%-5s %-5s %-8s %s\n' kind exit seconds "what rank 0 says"
    printf '%s\n' "${rows[@]}"
    ;;
  *)
    echo "gpus_nccl.sh: unknown part '$part' (equivalence, overlap, bandwidth, fault)" >&2
    exit 2
    ;;
esac
