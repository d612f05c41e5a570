#!/usr/bin/env bash
# launch/bench/profile_routing.sh — on a GPU machine, from the repository root, with build/
# and .gpu-libs/ made by launch/bench/gpu_bundle.sh: Nsight Compute's counters for the
# routing kernels of `fathom bench` (docs/performance.md records what they said).
#   route   the two-phase Block MHAR delta routing of the 8B graft (d 4096, N 2..9, G 8);
#   msar    the MSAR stream route of the same sites (m 4, kernels 1 2 4 8);
#   train   the block kernels as one `fathom train` step launches them at 8 layers of the 8B
#           width (launch/bench/train_8b_width.sh's configuration, MHAR delta: N 2..5,
#           4096 tokens), where `fathom bench`'s sizes (N up to 9, 8192 tokens) do not look;
#   step-msar  the 1B step's MSAR (replace form, two phases, d 1280): the stream convolutions,
#           the merges and the block forward.
# For every kernel (one ncu pass each) LAUNCHES launches (default 2) after SKIP (default 4): time, DRAM and L1 throughput, issue activity, occupancy, registers and the two
# largest warp stall reasons. Needs ncu with hardware counters (the Firecracker machines).
# Arguments: the bench cases (default: route msar). Logs in $OUT (or /tmp/profile-routing).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/profile-routing}
mkdir -p "$out"
. launch/bench/gpu_env.sh
ncu=$FATHOM_NCU
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(route msar)
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
dram__bytes.sum.per_second,l1tex__throughput.avg.pct_of_peak_sustained_active,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,\
sm__inst_executed.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,\
launch__grid_size,launch__block_size,launch__shared_mem_per_block_dynamic,\
smsp__average_warp_latency_issue_stalled_barrier.ratio,\
smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_wait.ratio,\
smsp__average_warp_latency_issue_stalled_not_selected.ratio,\
smsp__average_warp_latency_issue_stalled_selected.ratio,\
smsp__average_warp_latency_issue_stalled_membar.ratio
kernels_of() { # the kernels of a case, one ncu pass each
  case $1 in
    route) echo route_block_forward add_scaled route_block_dots route_block_walk route_block_reduce ;;
    train) echo route_block_forward route_block_walk route_block_dots add_scaled ;;
    msar) echo route_conv_dots route_conv_weights route_conv_mix route_conv_score \
                route_conv_gradient route_conv_reduce stream_mix_forward stream_mix_backward ;;
    step-msar) echo stream_conv_forward stream_conv_taps_partial stream_conv_input_grad \
                    route_merge_forward route_merge_backward route_block_forward ;;
    *) echo route_ add_scaled stream_ ;;
  esac
}
. launch/bench/train_8b_command.sh
train_8b_command build/fathom /tmp/profile-routing-run 8 1 mhar_delta
for c in "${cases[@]}"; do
  : >"$out/ncu-$c.csv"
  command=(build/fathom bench --device cuda --cases "$c" --repeat 1)
  [ "$c" = train ] && command=("${train_8b[@]}")
  for k in $(kernels_of "$c"); do
    rm -rf /tmp/profile-routing-run
    timeout 120 "$ncu" --clock-control none --kernel-name regex:"$k" \
      --launch-skip "${SKIP:-4}" --launch-count "${LAUNCHES:-2}" --metrics "$metrics" --csv \
      --page raw "${command[@]}" \
      >>"$out/ncu-$c.csv" 2>>"$out/ncu-$c.err" || echo "ncu $c $k: exit $?"
  done
done
rm -rf /tmp/profile-routing-run
python3 - "$out" "${cases[@]}" <<'PY'
import csv, io, os, sys
out, cases = sys.argv[1], sys.argv[2:]
short = {"gpu__time_duration.sum": "us", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
         "dram__bytes.sum.per_second": "dramB/s", "l1tex__throughput.avg.pct_of_peak_sustained_active": "l1%",
         "lts__throughput.avg.pct_of_peak_sustained_elapsed": "l2%",
         "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
         "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%", "launch__registers_per_thread": "regs",
         "launch__grid_size": "grid", "launch__block_size": "block"}
for c in cases:
    text = open(os.path.join(out, f"ncu-{c}.csv")).read()
    lines = [l for l in text.splitlines() if l.startswith('"')]
    header = next((l for l in lines if l.startswith('"ID"')), None)
    if header is None:
        print(f"{c}: no rows (see ncu-{c}.err)"); continue
    # every pass repeats the header and a row of units; keep one header
    body = [l for l in lines if not l.startswith('"ID"') and not l.startswith('"","",')]
    rows = list(csv.DictReader(io.StringIO("\n".join([header] + body))))
    print(f"\n=== {c}")
    for r in rows:
        name = r["Kernel Name"].split("(")[0].split("<")[0][-28:]
        stalls = {k.split("stalled_")[1].split(".")[0]: float((r[k] or "0").replace(",", "")) for k in r if "stalled_" in k}
        top = sorted(stalls.items(), key=lambda kv: -kv[1])[:3]
        vals = []
        for k, s in short.items():
            v = r.get(k, "")
            try:
                f = float(v.replace(",", ""))
                v = f"{f/1e9:.0f}G" if s == "dramB/s" else (f"{f:.0f}" if f >= 100 else f"{f:.1f}")
            except ValueError:
                pass
            vals.append(f"{s}={v}")
        print(f"{name:<28} " + " ".join(vals) + "  stalls " + ", ".join(f"{k}:{v:.1f}" for k, v in top))
PY
