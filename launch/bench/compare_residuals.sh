#!/usr/bin/env bash
# launch/bench/compare_residuals.sh — the residual modes side by side on the synthetic
# corpus: the demo model, the same seed and steps, baseline / AttnRes / MHAR H=4 / MHAR H=8 /
# MSAR m=4 (docs/residual-comparison.md holds a run). Extra arguments go to every run
# (e.g. --set train.steps=400). Prints a markdown table, and draws the runs overlaid into
# $out/plots (launch/tools/plot.py; each run saves its last step, whose config names the
# residual mode in the legends).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${COMPARE_DIR:-runs/compare}
rm -rf "$out"
runs=(
  "baseline|launch/configs/demo.yaml|"
  "AttnRes (full, H 1)|launch/configs/demo_attnres.yaml|"
  "MHAR (block, H 4)|launch/configs/demo_block_mhar.yaml|"
  "MHAR (block, H 8)|launch/configs/demo_block_mhar.yaml|--set residual.heads=8"
  "MSAR (block, m 4, H 4)|launch/configs/demo_msar.yaml|"
)
echo "| residual | parameters | train loss (last 10 steps) | val loss | tok/s |"
echo "|---|---|---|---|---|"
i=0
for run in "${runs[@]}"; do
  IFS='|' read -r name config extra <<<"$run"
  dir="$out/$i"
  # shellcheck disable=SC2086
  build/fathom train "$config" --set run_dir="$dir" --set eval.every=1000000 \
    --set eval.samples=64 --set checkpoint.every=1000000 $extra "$@" >"$out.$i.log" 2>&1
  python3 - "$dir/metrics.jsonl" "$out.$i.log" "$name" <<'PY'
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if "val_loss" not in l]
val = [l["val_loss"] for l in lines if "val_loss" in l][-1]
log = open(sys.argv[2]).read()
params = re.search(r"fathom: ([0-9.]+M) parameters", log).group(1)
rate = sum(l["tokens_per_s"] for l in steps) / len(steps)
print(f"| {sys.argv[3]} | {params} | {steps[-1]['loss']:.4f} | {val:.4f} | {rate/1e3:.1f}k |")
PY
  i=$((i + 1))
done
python3 launch/tools/plot.py "$out"/[0-9]* --out "$out/plots" >&2
