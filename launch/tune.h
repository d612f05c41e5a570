/* launch/tune.h — `fathom tune CONFIG.yaml [--set key=value ...] [--out FILE]
 * [--candidates N] [--repeats N]` (docs/reference.md).
 *
 * Chooses the cuda backend's matrix product algorithms for a config, once, and writes them
 * to a table that runs name with `matmul_algorithms` (runtime/matmul_table.h says why the
 * choice is not made at every launch). It runs one training step of the config's model on
 * one process and one GPU, so that every product the config's steps run is made, then times
 * up to N of cuBLASLt's candidates for each (kernels/cuda/matmul_tune_cuda.cu) and keeps the
 * fastest that repeats its bits, where it leads the heuristic's choice by 1% or more.
 *
 * A layer's products depend on the widths, the vocabulary and the microbatch's tokens, not on
 * the depth or the layout: the step takes one process (parallel.pp and dp 1), one microbatch,
 * synthetic tokens, and at most one block of layers (one layer without blocks), so that a
 * config of a job of many GPUs tunes on one. Exit 2 without a GPU.
 */
#ifndef FATHOM_LAUNCH_TUNE_H
#define FATHOM_LAUNCH_TUNE_H

int tune_main(int argc, char **argv);

#endif
