#!/usr/bin/env bash
# launch/bench/profile_source.sh — on a GPU machine, from the repository root, with build/
# and .gpu-libs/ made by launch/bench/gpu_bundle.sh: where one kernel's warps wait, by source
# line. Nsight Compute samples the warps' stall reasons at every SASS instruction of one
# launch (the SourceCounters section); this script sums the samples by CUDA source line
# (the build compiles with -lineinfo) and prints the lines that hold most of them, each
# with its two largest stall reasons.
#   profile_source.sh KERNEL_REGEX [CASE]
# CASE is `train` (default: one step of launch/bench/train_8b_width.sh's 8-layer MHAR delta
# configuration, where the block kernels run at N 2..5 and 4096 tokens), `kernel-bench:GROUP`
# (`fathom-kernel-bench GROUP`, e.g. kernel-bench:mix for MSAR's kernels at the 1B
# microbatch) or a `fathom bench` case. SKIP (default 4) launches are skipped first. Writes $OUT (default
# /tmp/profile-source): the report (.ncu-rep), the per-instruction CSV and the summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: profile_source.sh KERNEL_REGEX [CASE]"; exit 2; }
kernel=$1 case=${2:-train}
out=${OUT:-/tmp/profile-source}
mkdir -p "$out"
. launch/bench/gpu_env.sh
ncu=$FATHOM_NCU
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
. launch/bench/train_8b_command.sh
train_8b_command build/fathom /tmp/profile-source-run 8 1 mhar_delta
command=(build/fathom bench --device cuda --cases "$case" --repeat 1)
[ "$case" = train ] && command=("${train_8b[@]}")
case $case in kernel-bench:*) command=(build/kernels/fathom-kernel-bench "${case#kernel-bench:}") ;; esac
name=$(echo "$kernel" | tr -c 'a-zA-Z0-9_\n' '_')
report="$out/$name"
rm -rf /tmp/profile-source-run "$report.ncu-rep"
timeout 300 "$ncu" --clock-control none --kernel-name regex:"$kernel" --launch-skip "${SKIP:-4}" \
  --launch-count 1 --section SourceCounters --section WarpStateStats \
  --import-source yes -o "$report" "${command[@]}" >"$report.log" 2>&1 ||
  { echo "ncu: exit $? (see $report.log)"; tail -5 "$report.log"; exit 1; }
rm -rf /tmp/profile-source-run
"$ncu" --import "$report.ncu-rep" --page source --csv --print-source cuda,sass \
  >"$report.csv" 2>"$report.err" ||
  { echo "ncu --page source: exit $? (see $report.err)"; head -5 "$report.err"; exit 1; }
python3 - "$report.csv" <<'PY' | tee "$report.txt"
# The source page: per file a "File Path" row, then a header, then a row for each CUDA line
# (its number first: the line's sums) followed by its SASS rows (no number).
import csv, sys
from collections import defaultdict
path, header = "?", None
samples, executed, text = defaultdict(float), defaultdict(float), {}
reasons = defaultdict(lambda: defaultdict(float))
for r in csv.reader(open(sys.argv[1], errors="replace")):
    if len(r) == 2 and r[0] == "File Path":
        path = r[1].split("/")[-1]
        continue
    if r and r[0] == "Line No":
        header = r
        continue
    if header is None or len(r) < len(header) or not r[0].isdigit():
        continue
    key = f"{path}:{r[0]}"
    try:
        samples[key] += float(r[4].replace(",", "") or 0)
        executed[key] += float(r[7].replace(",", "") or 0)
    except ValueError:  # a source line whose quotes the CSV did not escape
        continue
    text[key] = r[1].strip()[:60]
    for i, column in enumerate(header):
        if column.startswith("stall_") and "Not Issued" not in column:
            try:
                reasons[key][column[6:]] += float(r[i].replace(",", ""))
            except ValueError:
                pass
total = sum(samples.values()) or 1
print(f"{total:.0f} stall samples, {sum(executed.values()) / 1e6:.1f} M warp instructions "
      "(an inlined line counts in each file that names it)")
for key, value in sorted(samples.items(), key=lambda kv: -kv[1])[:30]:
    top = sorted(reasons[key].items(), key=lambda kv: -kv[1])[:3]
    print(f"{100 * value / total:5.1f}% {executed[key] / 1e3:8.0f}k {key:<36} {text[key]:<60} " +
          ", ".join(f"{k}:{100 * v / max(value, 1):.0f}%" for k, v in top))
PY
