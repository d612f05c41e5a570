#!/usr/bin/env bash
# launch/bench/tune_gpu.sh — the matrix products on algorithms `fathom tune` chose, against
# cuBLASLt's heuristic's, in the same run. On a GPU machine, from the repository root, with
# build/ and .gpu-libs/ made by launch/bench/gpu_bundle.sh; builds nothing.
#   launch/bench/tune_gpu.sh tests   the tuning and table tests (about a minute)
#   launch/bench/tune_gpu.sh 8b      `fathom tune` of the 8B width (4096 tokens a microbatch),
#                                    then (a), `fathom bench --cases layers` without and with
#                                    the table around peer.py's torch.compile layers, and
#                                    launch/bench/train_8b_width.sh 8 7 standard mhar_delta
#                                    without and with the table, two rounds (about 8 minutes)
#   launch/bench/tune_gpu.sh 1b      `fathom tune` of the 1B step's shape, then `fathom bench
#                                    --cases step-standard,step-mhar-delta` without and with
#                                    --matmul-algorithms, two rounds (about 6 minutes)
# Tables and logs go to $OUT (default /tmp): t8b.matmul, t1b.matmul, tune*.log.
set -u
cd "$(dirname "$0")/../.."
. launch/bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
out=${OUT:-/tmp}
mkdir -p "$out"
tests() { build/tests/fathom-tests --jobs=8 --filter "$1" 2>&1 | grep -E "FAIL|CRASH|Synthesis" | tail -${2:-4}; }
case ${1:-tests} in
tests)
  tests 'cuda_matmul_tune/*' 8; tests 'cuda_matmul/*'; tests 'matmul_table/*'; tests 'cli/*'
  tests 'cuda_train/*' 6 ;;
8b)
  . launch/bench/train_8b_command.sh
  train_8b_command build/fathom /tmp/tune-unused 2 1 standard
  # the timed runs' keys, as fathom tune takes them (it cuts the layers and the layout)
  /usr/bin/time -v build/fathom tune launch/configs/marin8b_block_mhar.yaml \
    "${train_8b[@]:3}" --out "$out/t8b.matmul" >"$out/tune8b.log" 2>"$out/tune8b.time"
  grep "fathom tune" "$out/tune8b.log" | tail -25
  grep -E "Elapsed|Maximum resident" "$out/tune8b.time"
  echo "-- (a): 4 Llama-3-8B layers, fathom without and with the table, torch.compile between"
  layers() { timeout 120 build/fathom bench --device cuda --cases layers --repeat 30 "$@" 2>&1 |
             grep -E "^layers"; }
  layers | sed 's/^/heuristic: /'; layers --matmul-algorithms "$out/t8b.matmul" | sed 's/^/tuned: /'
  timeout 300 python3 launch/bench/peer.py --cases layers --repeat 20 2>&1 | grep -iE "layers" | tail -3
  layers | sed 's/^/heuristic: /'; layers --matmul-algorithms "$out/t8b.matmul" | sed 's/^/tuned: /'
  for round in 1 2; do
    OUT=$out TRAIN_TAG=heuristic$round launch/bench/train_8b_width.sh 8 7 standard mhar_delta
    FATHOM_SET="matmul_algorithms=$out/t8b.matmul" OUT=$out TRAIN_TAG=tuned$round \
      launch/bench/train_8b_width.sh 8 7 standard mhar_delta
  done
  grep -h "matmul products" "$out/tuned1-standard-8.log" ;;
1b)
  . launch/bench/model_1b.sh
  build/fathom tune launch/configs/demo.yaml --set device=cuda "${model_1b[@]}" \
    --set train.microbatch_size=8 --out "$out/t1b.matmul" >"$out/tune1b.log" 2>&1
  grep "fathom tune" "$out/tune1b.log" | tail -25
  for round in 1 2; do
    for kind in heuristic tuned; do
      table=(); [ $kind = tuned ] && table=(--matmul-algorithms "$out/t1b.matmul")
      json=$out/bench1b-$kind-$round.jsonl
      timeout 240 build/fathom bench --device cuda --cases step-standard,step-mhar-delta \
        --repeat 3 --json "$json" "${table[@]}" >"$out/bench1b-$kind-$round.log" 2>&1
      python3 - "$json" "$kind-$round" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(sys.argv[2], r.get("case", ""), r.get("mode", ""), round(r["ms"], 2), "ms")
PY
    done
  done ;;
*) echo "usage: launch/bench/tune_gpu.sh tests|8b|1b" >&2; exit 2 ;;
esac
