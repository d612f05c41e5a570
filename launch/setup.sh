#!/usr/bin/env bash
# launch/setup.sh — installs what fathom needs on Debian 12 and builds it into build/.
#
# Idempotent: packages already present are not reinstalled and an existing build directory
# is reused. Needs root or sudo for apt-get when a package is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential pkg-config meson ninja-build libyaml-dev libhdf5-dev hdf5-tools
          libcriterion-dev python3 python3-pip openmpi-bin libopenmpi-dev libhwloc-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python side: the tokenizer front end, launch/tools/plot.py (matplotlib; PyYAML reads the
# config saved in a checkpoint) and the tests that read files with h5py and ruamel.yaml.
if ! python3 -c 'import h5py, numpy, tokenizers, matplotlib, yaml, ruamel.yaml' 2>/dev/null; then
  echo "setup: installing python packages h5py numpy tokenizers matplotlib pyyaml ruamel.yaml"
  python3 -m pip install -q h5py numpy tokenizers matplotlib pyyaml ruamel.yaml 2>/dev/null ||
    python3 -m pip install -q --break-system-packages h5py numpy tokenizers matplotlib pyyaml ruamel.yaml
fi

if [ ! -f build/build.ninja ]; then
  native=()
  if command -v nvcc >/dev/null; then
    # meson 1.0 asks nvcc for no dependency files: compile CUDA through a script that does,
    # so that ninja rebuilds the .cu files whose headers changed (launch/tools/nvcc-depfile)
    mkdir -p build
    printf "[binaries]\ncuda = '%s/launch/tools/nvcc-depfile'\n" "$PWD" >build/nvcc-native.ini
    native=(--native-file build/nvcc-native.ini)
  fi
  meson setup build --buildtype=release "${native[@]}" >/dev/null
fi
ninja -C build
