#!/usr/bin/env bash
# launch/bench/profile_idle.sh — how much of a `fathom train` step the GPU spends idle: the
# step's wall time (launch/bench/train_8b_width.sh: the median of steps 3 on) against the
# sum of its kernels' times. Nsight Compute times every kernel of a STEPS-step run and of a
# (STEPS - 1)-step run, caches and clocks left as they are (--cache-control none
# --clock-control none); the difference of the two sums is the last step's kernel time.
# Kernels run one at a time under ncu, so the sum holds no overlap between them: what the
# wall time has beyond it is time the GPU waited (on the host, a synchronisation, a copy).
# From the repository root on a GPU machine with ncu.
#   launch/bench/profile_idle.sh [LAYERS] [RESIDUAL] [STEPS]   (default 4 standard 3)
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:-4}
residual=${2:-standard}
steps=${3:-3}
out=${OUT:-/tmp/profile-idle}
mkdir -p "$out"
. launch/bench/gpu_env.sh
ncu=$FATHOM_NCU
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
. launch/bench/train_8b_command.sh
dir=/tmp/profile-idle-run
for count in $((steps - 1)) "$steps"; do
  train_8b_command build/fathom "$dir" "$layers" "$count" "$residual" || exit 2
  rm -rf "$dir"
  "$ncu" --clock-control none --cache-control none --csv --page raw \
    --metrics gpu__time_duration.sum "${train_8b[@]}" >"$out/steps-$count.csv" \
    2>"$out/steps-$count.err" || echo "ncu ($count steps): exit $?"
done
rm -rf "$dir"
OUT=$out TRAIN_TAG=idle launch/bench/train_8b_width.sh "$layers" 6 "$residual" |
  tee "$out/wall.txt"
python3 - "$out/steps-$((steps - 1)).csv" "$out/steps-$steps.csv" "$out/wall.txt" <<'PY'
import csv, io, sys
def kernel_ms(path):
    lines = [l for l in open(path).read().splitlines() if l.startswith('"')]
    body = [l for l in lines[1:] if not l.startswith('"ID"') and not l.startswith('"","",')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[:1] + body))))
    return sum(float((r.get("gpu__time_duration.sum") or "0").replace(",", "")) for r in rows) / 1e6, len(rows)
before, n_before = kernel_ms(sys.argv[1])
after, n_after = kernel_ms(sys.argv[2])
step_kernels = after - before
fields = open(sys.argv[3]).read().split()
wall = float(fields[4]) if len(fields) >= 5 else float("nan")
print(f"one step: {n_after - n_before} kernels, {step_kernels:.1f} ms of kernel time; "
      f"wall {wall:.1f} ms; the GPU idle {wall - step_kernels:.1f} ms "
      f"({100 * (wall - step_kernels) / wall:.1f}% of the step)")
PY
