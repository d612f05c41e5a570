/* kernels/cuda/matmul_internal.h — what matmul_cuda.cu (the products and their plans) shares
 * with matmul_tune_cuda.cu (timing cuBLASLt's candidates for every plan a step made).
 *
 * A plan is one (product, rows, in_dim, out_dim, operand alignments) key with its cuBLASLt
 * descriptors and algorithm (matmul_cuda.cu's header says how the three products map onto
 * cuBLASLt's column-major view). The plans live in matmul_cuda.cu's table for the life of
 * the process; nothing here frees them.
 */
#ifndef FATHOM_KERNELS_CUDA_MATMUL_INTERNAL_H
#define FATHOM_KERNELS_CUDA_MATMUL_INTERNAL_H

#include "runtime/matmul_table.h"

#include <cublasLt.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct MatmulPlan {
    MatmulProduct product;
    int rows, in_dim, out_dim;
    uint32_t alignment_a, alignment_b, alignment_c; /* bytes, at most 256 */
    cublasLtMatmulDesc_t operation;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c; /* C and D share layout_c */
    cublasLtMatmulAlgo_t algorithm;
    bool from_table; /* the algorithm is the matmul_algorithms table's */
    int64_t calls;   /* products run with this plan so far */
} MatmulPlan;

/* The largest power of two (at most 256) dividing the address: what cuBLASLt may assume. */
uint32_t matmul_pointer_alignment(const void *pointer);

/* The process's cuBLASLt handle and workspace (made on first use), and the bytes of it the
 * algorithms may use (FATHOM_MATMUL_WORKSPACE_MIB, else all 32 MiB). */
cublasLtHandle_t matmul_library(void);
void *matmul_workspace_memory(void);
uint64_t matmul_workspace_bytes(void);

/* The plans made so far, in the order their keys first ran. */
int matmul_plan_total(void);
MatmulPlan *matmul_plan_at(int index);

/* cuBLASLt's heuristic for `plan` (descriptors made): up to `wanted` candidates, best
 * ranked first, under the workspace and alignments, split-K only with fp32 sums; returns
 * how many (fatal, exit 5, when none). */
int matmul_heuristic(const MatmulPlan *plan, cublasLtMatmulHeuristicResult_t *results,
                     int wanted);

/* Whether cuBLASLt can run `algorithm` for `plan` here: within the workspace, at the plan's
 * operand alignments. */
bool matmul_algorithm_runs(const MatmulPlan *plan, const cublasLtMatmulAlgo_t *algorithm);

#endif
