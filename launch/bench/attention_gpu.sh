#!/usr/bin/env bash
# launch/bench/attention_gpu.sh — on a GPU machine, from the repository root, with build/ and
# .gpu-libs/ made by launch/bench/gpu_bundle.sh: the attention kernels' checks and timings in
# one go, about 3-4 minutes, builds nothing, a short table last.
#   1. the cuda attention tests (every kernel variant against the cpu reference, the backward's
#      bits across runs, the fused backward against the two-pass one at the 8B and 1B shapes);
#   2. the GPU tests that run attention inside the model (Hugging Face fixtures; 20 training
#      steps against the cpu, two runs' bits, no allocation after the first step), then the
#      fixtures again with other variants (FATHOM_ATTENTION_FORWARD=specialised,
#      FATHOM_ATTENTION_BACKWARD=fused_tma);
#   3. compute-sanitizer memcheck over one test of each new kernel, where the tool is present;
#   4. fathom-kernel-bench attention: every variant (forwards grouped, specialised, persistent;
#      backwards fused, fused_tma, two_pass) at (b) B1 T4096 32/8 hd128, the 1B shape
#      B32 T1024 16/8 hd80 and B2 T4096 32/8 hd64; then (a), `fathom bench --cases layers`
#      (4 Llama-3-8B layers) with each forward;
#   5. PyTorch SDPA at the same shapes (peer.py); with LAYERS=1 also (a) in PyTorch (eager and
#      torch.compile: about 2 more minutes);
#   6. with NCU=1, ncu on the new kernels at the (b) shape, where ncu is present (~1 more
#      minute);
#   7. with TRAIN=1, `fathom train` on 8 layers of the 8B width (launch/bench/train_8b_width.sh,
#      5 steps) with each forward, and its MFU (about 2 more minutes).
# Logs go to $OUT (or /tmp/attention-gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/attention-gpu}
mkdir -p "$out"
. launch/bench/gpu_env.sh
shapes="1,4096,32,8,128;32,1024,16,8,80;2,4096,32,8,64"
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,temperature.gpu \
  --format=csv,noheader | tee "$out/gpu.txt"

stamp "1. cuda attention tests"
timeout 120 build/tests/fathom-tests --jobs=4 --filter 'cuda_attention/*' --verbose=1 \
  >"$out/attention-tests.log" 2>&1
echo "exit $?" >>"$out/attention-tests.log"
grep -E "\[FAIL\]|Assertion|Synthesis|relative error|differs|fused against|^exit" \
  "$out/attention-tests.log" | head -40

stamp "2. model tests on the GPU (fixtures, training against the cpu)"
timeout 60 build/tests/fathom-tests --jobs=4 --filter 'cuda_reference/*' --verbose=1 \
  >"$out/reference-tests.log" 2>&1
echo "exit $?" >>"$out/reference-tests.log"
train='@(standard_residual_follows_the_cpu_for_20_steps|two_cuda_runs_are_bitwise_identical'
train+='|nothing_is_allocated_after_the_first_step)'
timeout 120 build/tests/fathom-tests --jobs=3 --filter "cuda_train/$train" --verbose=1 \
  >"$out/train-tests.log" 2>&1
echo "exit $?" >>"$out/train-tests.log"
FATHOM_ATTENTION_FORWARD=specialised FATHOM_ATTENTION_BACKWARD=fused_tma timeout 60 \
  build/tests/fathom-tests --jobs=4 --filter 'cuda_reference/*' --verbose=1 \
  >"$out/reference-specialised-tests.log" 2>&1
echo "exit $?" >>"$out/reference-specialised-tests.log"
grep -hE "\[FAIL\]|Synthesis|^exit" "$out/reference-tests.log" "$out/train-tests.log" \
  "$out/reference-specialised-tests.log"

if command -v compute-sanitizer >/dev/null; then
  stamp "3. compute-sanitizer memcheck, the new kernels"
  timeout 60 compute-sanitizer --tool memcheck --target-processes all \
    build/tests/fathom-tests --jobs=1 \
    --filter 'cuda_attention/@(@(backward|specialised_forward|fused_tma_backward)_matches_cpu_with_grouped_heads_and_a_ragged_tail|persistent_forward_matches_cpu_and_specialised_at_head_dim_80)' \
    >"$out/memcheck.log" 2>&1
  echo "exit $?" >>"$out/memcheck.log"
  grep -E "ERROR SUMMARY|Invalid|Synthesis|^exit" "$out/memcheck.log" | head -10
fi

stamp "4. fathom-kernel-bench attention"
: >"$out/kernel-bench.txt"
for variant in grouped specialised persistent fused fused_tma two_pass; do # one process each: a fault
  timeout 40 build/kernels/fathom-kernel-bench attention $variant 2>&1 | grep -v "^#" \
    | tee -a "$out/kernel-bench.txt"                           # loses one variant's numbers
done
for forward in grouped specialised persistent; do
  FATHOM_ATTENTION_FORWARD=$forward timeout 60 build/fathom bench --cases layers \
    --json "$out/layers-$forward.jsonl" >"$out/layers-$forward.txt" 2>&1
  echo "(a) forward $forward: $(grep -h layers "$out/layers-$forward.txt" | tail -1)"
done

stamp "5. PyTorch SDPA"
peer_cases=attention
[ "${LAYERS:-0}" = 1 ] && peer_cases=attention,layers
timeout 240 python3 launch/bench/peer.py --cases "$peer_cases" --attention-shapes "$shapes" \
  >"$out/peer.txt" 2>&1
grep -v "^{" "$out/peer.txt" | tail -8

if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  stamp "6. ncu, new kernels at B1 T4096 32/8 hd128"
  for kernel in attention_forward_specialised_kernel attention_backward_fused_kernel; do
    variant=$([ $kernel = attention_forward_specialised_kernel ] && echo specialised || echo fused)
    timeout 45 ncu --clock-control none --launch-count 1 --kernel-name "regex:$kernel" \
      --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section LaunchStats build/kernels/fathom-kernel-bench attention $variant \
      >>"$out/ncu.txt" 2>&1
  done
  grep -E "attention_|Duration|Throughput|Achieved Occupancy|Registers|Stall|Issued Warp" \
    "$out/ncu.txt" | head -30
fi

if [ "${TRAIN:-0}" = 1 ]; then
  stamp "7. fathom train, 8 layers of the 8B width"
  for forward in grouped specialised; do
    FATHOM_ATTENTION_FORWARD=$forward OUT="$out" TRAIN_TAG=$forward timeout 200 \
      launch/bench/train_8b_width.sh 8 5 standard | tee -a "$out/train-8b.txt"
    python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])];
m=[x['mfu'] for x in r if x.get('mfu') is not None][2:]
print('$forward forward: MFU', f'{100*statistics.median(m):.1f}%' if m else 'not reported')" \
      "/tmp/train-8b-width-runs/$forward-standard-8/metrics.jsonl" 2>&1 | tee -a "$out/train-8b.txt"
  done
fi

stamp "summary"
python3 - "$out" <<'EOF'
import json, re, sys
out = sys.argv[1]
def read(name):
    try:
        return open(f"{out}/{name}").read()
    except OSError:
        return ""
for name in ("attention-tests.log", "reference-tests.log", "train-tests.log",
             "reference-specialised-tests.log"):  # the last: specialised forward, fused_tma
    text = read(name)
    synthesis = re.findall(r"Synthesis: .*", text)
    ended = re.findall(r"^exit (\d+)", text, re.M)
    print(f"{name:<32} {synthesis[-1] if synthesis else 'no synthesis'}"
          f"{'' if ended and ended[-1] == '0' else '  (exit ' + (ended[-1] if ended else '?') + ')'}")
memcheck = re.findall(r"ERROR SUMMARY: .*", read("memcheck.log"))
if memcheck:
    print(f"{'memcheck':<32} {memcheck[-1]}")
ours = {}
for line in read("kernel-bench.txt").splitlines():
    m = re.match(r"attention (fwd|bwd) (\w+) (B\d+ T\d+ \d+/\d+ hd\d+)\s+([\d.]+) ms", line)
    if m:
        ours[(m.group(3), m.group(1), m.group(2))] = float(m.group(4))
peer = {}
layers_peer = {}
for line in read("peer.txt").splitlines():
    if line.startswith("{"):
        row = json.loads(line)
        if row["case"] == "layers":
            layers_peer[row["mode"]] = row["ms"]
            continue
        mode = row["mode"].split(" ", 1)
        shape = mode[1] if len(mode) > 1 else "B1 T4096 32/8 hd128"
        peer[(shape, mode[0])] = row["ms"]
shapes = sorted({k[0] for k in ours} | {k[0] for k in peer}, key=lambda s: -int(s.split("hd")[1]))
cell = lambda v: f"{v:.3f}" if v else "-"
ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
print(f"\n{'shape':<21} {'fwd grp':>7} {'fwd spec':>8} {'bwd fused':>9} {'bwd tma':>7} "
      f"{'bwd 2pass':>9} {'SDPA fwd':>8} {'SDPA f+b':>8} {'fwd ratio':>9} {'f+b ratio':>9}")
def fastest(*values):
    found = [v for v in values if v]
    return min(found) if found else None
failed = re.findall(r"\[FAIL\] cuda_attention::(\w+)", read("attention-tests.log"))
passed = {  # a kernel whose own tests failed does not count in the ratios
    "specialised": not any(n.startswith("specialised_forward") for n in failed),
    "fused_tma": not any(n.startswith("fused_tma_backward") for n in failed),
    "fused": not any(re.match(r"(fused_)?backward_", n) for n in failed),
}
for s in shapes:
    grouped, spec = ours.get((s, "fwd", "grouped")), ours.get((s, "fwd", "specialised"))
    fused, tma = ours.get((s, "bwd", "fused")), ours.get((s, "bwd", "fused_tma"))
    two = ours.get((s, "bwd", "two_pass"))
    sdpa_f, sdpa_fb = peer.get((s, "forward")), peer.get((s, "forward+backward"))
    best_f = fastest(grouped, spec if passed["specialised"] else None)
    best_b = fastest(fused if passed["fused"] else None, tma if passed["fused_tma"] else None)
    print(f"{s:<21} {cell(grouped):>7} {cell(spec):>8} {cell(fused):>9} {cell(tma):>7} "
          f"{cell(two):>9} {cell(sdpa_f):>8} {cell(sdpa_fb):>8} {ratio(sdpa_f, best_f):>9} "
          f"{ratio(sdpa_fb, (best_f or 0) + (best_b or 0)):>9}")
print("(ms; ratios are PyTorch time / ours: the faster forward, plus the faster fused backward; "
      "only kernels whose tests passed count)")
if failed:
    print("failed: " + ", ".join(sorted(set(failed))))
for forward in ("grouped", "specialised"):
    for line in read(f"layers-{forward}.jsonl").splitlines():
        row = json.loads(line)
        if row.get("case") == "layers":
            compiled = layers_peer.get("compile")
            versus = f", {compiled / row['ms']:.2f}x torch.compile ({compiled:.1f} ms)" \
                if compiled else ""
            print(f"(a) 4 layers, {forward} forward: {row['ms']:.2f} ms{versus}")
for line in read("train-8b.txt").splitlines():
    print("(train, 8 layers) " + line)
EOF
