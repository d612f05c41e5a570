#!/usr/bin/env bash
# launch/bench/convert_8b.sh — `fathom convert` at full size: a random-weight model of
# Llama-3.1-8B's shapes written as a Hugging Face directory (make_hf_8b.py), imported twice
# with launch/configs/marin8b_block_mhar.yaml, once as the delta Block MHAR graft and once
# as the standard model; the time and peak host memory of each import, and the step-0 logits
# of one 4096-token window from each (fathom eval --dump-logits), which must be equal bit
# for bit (alpha = 0: the graft IS the base model, DESIGN 2.1).
#   launch/bench/convert_8b.sh [ROOT]      (about 5 minutes on one H200; ~55 GB of disk)
# FATHOM_BINARY names the binary (default build/fathom); logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=${1:-/tmp/convert-8b}
binary=${FATHOM_BINARY:-build/fathom}
out=${OUT:-/tmp}
rm -rf "$root"
mkdir -p "$root"
python3 launch/bench/make_hf_8b.py "$root/hf" 2>&1 | tail -1
# the graft on synthetic data (the window's tokens), and the same network as the base model
sed -e 's/source: shards/source: synthetic/' launch/configs/marin8b_block_mhar.yaml \
  >"$root/delta.yaml"
sed -e 's/mode: attnres/mode: standard/' "$root/delta.yaml" >"$root/base.yaml"
# peak resident memory of a child, from the kernel's own count
peak() {
  python3 -c "import resource, subprocess, sys, time
t = time.time(); code = subprocess.call(sys.argv[1:])
print(f'exit {code}, {time.time() - t:.1f} s, peak host memory '
      f'{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20:.2f} GiB')" "$@"
}
for form in delta base; do
  echo "== import as the $form model"
  peak "$binary" convert --from-hf "$root/hf" --config "$root/$form.yaml" \
    --to "$root/$form" >"$out/convert-8b-$form.log" 2>&1
  tail -2 "$out/convert-8b-$form.log"
  "$binary" eval --checkpoint "$root/$form" --weights raw --samples 1 \
    --dump-logits "$root/$form-logits.h5" >"$out/eval-8b-$form.log" 2>&1
  echo "eval exit $? ($form)"
  rm -rf "$root/$form/checkpoints" # the disk holds one import at a time
done
python3 - "$root/delta-logits.h5" "$root/base-logits.h5" <<'PY'
import sys, h5py, numpy
a, b = (h5py.File(p, "r")["logits"][()] for p in sys.argv[1:3])
same = a.shape == b.shape and numpy.array_equal(a.view(numpy.uint32), b.view(numpy.uint32))
print(f"step-0 logits {a.shape}: delta graft and base bit for bit equal: {same}"
      + ("" if same else f" (largest difference {numpy.abs(a - b).max():.3g})"))
PY
du -sh "$root/hf"
rm -rf "$root"
