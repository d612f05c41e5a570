#!/usr/bin/env bash
# launch/bench/routing_gpu.sh — on a GPU machine, from the repository root, with build/ and
# .gpu-libs/ made by launch/bench/gpu_bundle.sh: the checks and the timings of two-phase
# routing (docs/performance.md, "Two-phase routing").
#   1. the cuda tests it touches: the two-phase ops against the cpu per-site reference
#      (cuda_route_block), the routed model on cuda (cuda_model_route: delta at alpha 0 is
#      the base model, MSAR at init is Block AttnRes, routing gradients follow the cpu), the
#      per-site kernels (cuda_route, cuda_backend_route), MSAR's stream kernels and the
#      replace form's merges (cuda_stream, cuda_merge_conv, the merge backward's GradMode),
#      the table's entries and the 20-step cuda-against-cpu training runs;
#   2. `fathom bench`: the routing of the 8B graft and of the 1B step, two-phase and a site at
#      a time (route, route-sites, route-1b, route-1b-sites), then the steps (step8b: the 8B
#      width, 4 layers, standard / MHAR delta / MSAR delta; step: the 1B model, standard,
#      MHAR, MSAR; graft: the graft's routing through the model, the (c) and (d) cases);
#   3. a short table: every timing, and the ratios the targets are stated in.
# The 1B step's delta forms run too; OLD_BINARY=path runs the MSAR steps of another build's
# fathom as well, with OLD_MODULE (its CUDA module, when the op tables differ; default this
# build's).
# About 5 minutes on one H200. FULL=1 adds the pipeline runs on one GPU (cuda_pipeline) and
# `fathom train` at the 8B width with 8 layers
# (launch/bench/train_8b_width.sh 8 5): about 5 minutes more. Logs go to $OUT (default
# /tmp/routing-gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/routing-gpu}
rm -rf "$out"
mkdir -p "$out"
. launch/bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader \
  | tee "$out/gpu.txt"
start=$SECONDS

# ---- 1. tests: one line per suite, the failures in full ----
suite() { # filter, seconds
  local log=$out/tests-${1%%/*}.log
  timeout "$2" build/tests/fathom-tests --jobs=4 --filter "$1" --verbose=1 >"$log" 2>&1
  local status=$?
  local line
  line=$(grep -E "Synthesis" "$log" | tail -1)
  [ $status -eq 124 ] && line="TIMED OUT after $2 s: $line"
  printf 'test %-34s %s\n' "$1" "${line:-no synthesis (exit $status)}" | tee -a "$out/tests.txt"
  grep -E "\[FAIL\]|Assertion|relative error|deviation" "$log" | head -20
}
suite 'cuda_route_block/*' 90
suite 'cuda_route_gate/*' 30
suite 'cuda_model_route/*' 60
suite 'cuda_route/*' 60
suite 'cuda_backend_route/*' 30
suite 'cuda_backend/fills*' 20
suite 'cuda_stream/*' 60
suite 'cuda_merge_conv/*' 30
suite 'cuda_grad_mode/route*' 30
suite 'cuda_train/*follows*' 240
[ "${FULL:-0}" = 1 ] && suite 'cuda_pipeline/*' 120
echo "tests took $((SECONDS - start)) s"

# ---- 2. timings ----
bench() { # json name, seconds, cases, repeat
  timeout "$2" build/fathom bench --device cuda --cases "$3" --repeat "$4" \
    --json "$out/$1.jsonl" >"$out/$1.txt" 2>&1 || echo "bench $3: exit $? (see $out/$1.txt)"
}
bench route 60 route,route-sites,route-1b,route-1b-sites 20
bench step8b 100 step8b 6
bench step 100 step-standard,step-mhar,step-msar 6
bench step-delta 100 step-mhar-delta,step-msar-delta 6
bench graft 200 graft,graft-mhar-delta-sites,graft-msar-delta-sites 6
if [ -n "${OLD_BINARY:-}" ]; then # the MSAR steps of another build, in the same run
  FATHOM_CUDA_MODULE=${OLD_MODULE:-$PWD/build/kernels/libfathom_cuda.so} timeout 200 \
    "$OLD_BINARY" bench \
    --device cuda --cases step8b-msar-delta,step-msar,step-msar-delta --repeat 6 \
    --json "$out/old.jsonl" >"$out/old.txt" 2>&1 || echo "old bench: exit $? (see $out/old.txt)"
fi
if [ "${FULL:-0}" = 1 ]; then
  OUT=$out launch/bench/train_8b_width.sh 8 5 standard mhar_delta attnres_delta \
    | tee "$out/width8.txt"
fi
echo "all took $((SECONDS - start)) s"

# ---- 3. the table ----
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = []
for name in ("route", "step8b", "step", "step-delta", "graft", "old"):
    path = os.path.join(out, name + ".jsonl")
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("{"):
                row = json.loads(line)
                if name == "old":
                    row["mode"] += " (old)"
                rows.append(row)
at = {(r["case"], r["mode"]): r for r in rows}
print(f"\n{'case':<10} {'mode':<20} {'ms':>10} {'rate':>16} {'peak GiB':>9}")
for r in rows:
    peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
    print(f"{r['case']:<10} {r['mode']:<20} {r['ms']:>10.3f} {r['rate']:>10.1f} {r['unit']:<5} {peak:>9}")
def ratio(label, case, mode, base_mode, target):
    a, b = at.get((case, mode)), at.get((case, base_mode))
    if not a or not b:
        print(f"{label:<44} missing")
        return
    speed = b["ms"] / a["ms"]
    memory = ""
    if a["peak_gib"] and b["peak_gib"]:
        memory = f", peak memory {100 * (a['peak_gib'] / b['peak_gib'] - 1):+.1f}%"
    print(f"{label:<44} {speed:.3f}x{memory}   (target {target})")
print()
def ms(case, mode):
    return at.get((case, mode), {}).get("ms", float("nan"))
print(f"{'(c) route, two-phase delta':<44} {ms('route', 'two-phase delta'):.2f} ms   (target "
      f"<= 8 ms; block ops alone {ms('route', 'block ops only'):.2f} ms; per site "
      f"{ms('route', 'per site delta'):.2f} ms)")
print(f"{'route-1b, two-phase replace':<44} {ms('route-1b', 'two-phase replace'):.2f} ms   "
      f"(per site {ms('route-1b', 'per site replace'):.2f} ms)")
for mode, label, target in (("mhar-delta", "(c) MHAR delta", "<= 8 ms"),
                             ("mhar-delta-sites", "(c) MHAR delta a site at a time", "-"),
                             ("msar-delta", "(d) MSAR delta", "<= 40 ms"),
                             ("msar-delta-sites", "(d) MSAR delta a site at a time", "-")):
    print(f"{label + ', through the model (graft)':<44} "
          f"{ms('graft', mode) - ms('graft', 'standard'):.2f} ms a microbatch   "
          f"(target {target}; step {ms('graft', mode):.1f} against {ms('graft', 'standard'):.1f})")
ratio("(8B width) MHAR delta vs standard", "step8b", "mhar-delta", "standard", ">= 0.97x")
ratio("(8B width) MSAR delta vs standard", "step8b", "msar-delta", "standard", "-")
ratio("(8B width) MSAR delta (old build)", "step8b", "msar-delta (old)", "standard", "-")
ratio("(e) 1B MHAR vs standard", "step", "mhar", "standard", ">= 0.97x, memory <= +5%")
ratio("(e) 1B MSAR vs standard", "step", "msar", "standard", ">= 0.90x, memory <= +5%")
ratio("(e) 1B MHAR delta vs standard", "step", "mhar-delta", "standard", "-")
ratio("(e) 1B MSAR delta vs standard", "step", "msar-delta", "standard", "-")
ratio("(e) 1B MSAR (old build)", "step", "msar (old)", "standard", "-")
ratio("(e) 1B MSAR delta (old build)", "step", "msar-delta (old)", "standard", "-")
tests = open(os.path.join(out, "tests.txt")).read() if os.path.exists(os.path.join(out, "tests.txt")) else ""
print()
print(tests.rstrip())
PY
