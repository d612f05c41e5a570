#!/usr/bin/env bash
# launch/bench/profile_train_step.sh — where a routed step's extra time goes: Nsight Compute
# times every kernel of a one-step `fathom train` run at the 8B width (the configuration of
# launch/bench/train_8b_width.sh: blocks of 2 layers, 4 x 4096 tokens) for standard and for
# RESIDUAL, sums each kernel's time by name, and prints the names whose sums differ most.
# Kernels run one at a time under ncu, so the sums are device time without overlap; a gap
# between the difference of the sums and the difference of the steps' wall times is host
# time or lost overlap. From the repository root on a GPU machine with ncu.
#   launch/bench/profile_train_step.sh [LAYERS] [RESIDUAL]   (default 8 mhar_delta)
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:-8}
residual=${2:-mhar_delta}
out=${OUT:-/tmp/profile-train-step}
mkdir -p "$out"
. launch/bench/gpu_env.sh
ncu=$FATHOM_NCU
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
. launch/bench/train_8b_command.sh
for mode in standard "$residual"; do
  dir=/tmp/profile-train-step-run
  train_8b_command build/fathom "$dir" "$layers" 1 "$mode" || exit 2
  rm -rf "$dir"
  "$ncu" --clock-control none --csv --page raw --metrics gpu__time_duration.sum \
    "${train_8b[@]}" >"$out/$mode.csv" 2>"$out/$mode.err"
  echo "$mode: ncu exit $?"
  rm -rf "$dir"
done
python3 - "$out/standard.csv" "$out/$residual.csv" "$residual" <<'PY'
import csv, io, sys, collections
def sums(path):
    lines = [l for l in open(path).read().splitlines() if l.startswith('"')]
    if not lines:
        return collections.Counter(), collections.Counter()
    body = [l for l in lines[1:] if not l.startswith('"ID"') and not l.startswith('"","",')]
    time, count = collections.Counter(), collections.Counter()
    for r in csv.DictReader(io.StringIO("\n".join([lines[0]] + body))):
        name = r["Kernel Name"].split("(")[0].replace("void ", "")[:60]
        time[name] += float((r.get("gpu__time_duration.sum") or "0").replace(",", "")) / 1e6
        count[name] += 1
    return time, count
base, base_count = sums(sys.argv[1])
routed, routed_count = sums(sys.argv[2])
print(f"kernel time of the run: standard {sum(base.values()):.1f} ms in "
      f"{sum(base_count.values())} launches, {sys.argv[3]} {sum(routed.values()):.1f} ms in "
      f"{sum(routed_count.values())} launches")
names = sorted(set(base) | set(routed), key=lambda n: -abs(routed[n] - base[n]))
print(f"{'kernel':<60} {'standard ms':>11} {'n':>5} {'routed ms':>10} {'n':>5} {'diff ms':>8}")
for n in names[:30]:
    print(f"{n:<60} {base[n]:11.2f} {base_count[n]:5d} {routed[n]:10.2f} {routed_count[n]:5d} "
          f"{routed[n] - base[n]:8.2f}")
PY
