# launch/bench/gpu_env.sh — sourced by the GPU scripts of launch/bench, from the repository
# root: the environment that build/ and .gpu-libs/ (launch/bench/gpu_bundle.sh) need on the
# GPU machine. NVLink multicast stays off (NCCL_NVLS_ENABLE=0); Open MPI may run as root
# there; the tests find the binary and the sources through FATHOM_BINARY and
# FATHOM_SOURCE_DIR.
export PATH=$PWD/.gpu-libs/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.gpu-libs:$PWD/build/kernels${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 FATHOM_BINARY=$PWD/build/fathom \
  FATHOM_SOURCE_DIR=$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Nsight Compute, where the machine has it (the profile_*.sh scripts); empty otherwise
FATHOM_NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
export FATHOM_NCU
