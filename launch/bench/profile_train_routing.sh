#!/usr/bin/env bash
# launch/bench/profile_train_routing.sh — Nsight Compute on the routing kernels of one
# `fathom train` step at the 8B width (the configuration of launch/bench/train_8b_width.sh:
# blocks of 2 layers, 4 x 4096 tokens), one pass over the first LAUNCHES (default 60)
# routing launches of the step: each kernel's time, grid, registers, occupancy, DRAM and
# issue activity in launch order, then the time summed by kernel. Shows where a routed
# step's extra time goes at small N, where `fathom bench`'s route case (N up to 9, 8192
# tokens) does not look. From the repository root on a GPU machine with ncu.
#   launch/bench/profile_train_routing.sh [LAYERS] [RESIDUAL]   (default 8 mhar_delta)
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:-8}
residual=${2:-mhar_delta}
out=${OUT:-/tmp/profile-train-routing}
mkdir -p "$out"
. launch/bench/gpu_env.sh
ncu=$FATHOM_NCU
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
. launch/bench/train_8b_command.sh
dir=/tmp/profile-train-routing-run
train_8b_command build/fathom "$dir" "$layers" 1 "$residual" || exit 2
rm -rf "$dir"
"$ncu" --clock-control none --kernel-name regex:'route_|add_scaled' \
  --launch-count "${LAUNCHES:-60}" --csv --page raw \
  --metrics gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,\
sm__warps_active.avg.pct_of_peak_sustained_active,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,\
smsp__issue_active.avg.pct_of_peak_sustained_active \
  "${train_8b[@]}" >"$out/ncu.csv" 2>"$out/ncu.err"
echo "ncu exit $?"
rm -rf "$dir"
python3 - "$out/ncu.csv" <<'PY'
import csv, io, sys, collections
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.startswith('"')]
if not lines:
    print("no rows"); sys.exit(0)
header = lines[0]
body = [l for l in lines[1:] if not l.startswith('"ID"') and not l.startswith('"","",')]
rows = list(csv.DictReader(io.StringIO("\n".join([header] + body))))
f = lambda r, k: float((r.get(k) or "0").replace(",", ""))
total = collections.OrderedDict()
for r in rows:
    name = r["Kernel Name"].split("(")[0].split("<")[0].replace("void ", "")
    us = f(r, "gpu__time_duration.sum") / 1e3
    total.setdefault(name, [0.0, 0])
    total[name][0] += us
    total[name][1] += 1
    print(f"{name:<34} {us:8.1f} us grid {r['launch__grid_size']:>6} regs "
          f"{r['launch__registers_per_thread']:>4} "
          f"occ {f(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f}% "
          f"dram {f(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f}% "
          f"issue {f(r, 'smsp__issue_active.avg.pct_of_peak_sustained_active'):5.1f}%")
print()
for name, (us, count) in total.items():
    print(f"sum {name:<34} {us:9.1f} us over {count} launches")
print(f"sum of all {sum(v[0] for v in total.values()):.1f} us")
PY
