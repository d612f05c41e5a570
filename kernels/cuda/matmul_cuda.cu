/* kernels/cuda/matmul_cuda.cu — the three matrix products of a linear layer, on cuBLASLt.
 *
 *   forward:          out[rows, out_dim]  = in[rows, in_dim] @ weight[out_dim, in_dim]^T
 *   input gradient:   din[rows, in_dim]  += or = dout[rows, out_dim] @ weight
 *   weight gradient:  dweight[out_dim, in_dim] += or = dout^T @ in   (fp32 C and D)
 * A, B and the bf16 outputs are bf16, accumulation and alpha / beta fp32
 * (CUBLAS_COMPUTE_32F). "+=" is beta = 1 with C = D, so a bf16 din is rounded once; a
 * GRAD_WRITE (din's or dweight's) is beta = 0, for which cuBLASLt does not read C (the
 * forward relies on the same: its out is C = D too). Both run the plan's algorithm, and
 * D = alpha * sum + beta * C in fp32 adds exactly 0 to the sum when C is zeros, so beta = 0
 * gives the bits of beta = 1 on a zeroed output, except the sign of a zero: a sum that is
 * -0.0 (an fp32 sum of products that underflows from below; an exact cancellation gives
 * +0.0) stays -0.0 where the add onto zeros gives +0.0. No later op tells the two apart
 * (every sum they enter starts from +0.0; AdamW's update of a -0.0 gradient is the update of
 * +0.0). Writing a weight gradient spares the read of its fp32 C: 4 bytes a parameter, about
 * 3% of the product at the Llama-3-8B projections (docs/performance.md).
 *
 * Row-major through a column-major library: a row-major [r, c] matrix is the column-major
 * [c, r] matrix with leading dimension c, i.e. its transpose. Each product is therefore
 * computed transposed, with m, n, k and the operations below (every layout is
 * (stored rows, stored cols, ld) of the column-major view):
 *   forward:  out^T [out, rows]  = (W view [in, out], op T) (in view [in, rows], op N)
 *             m = out_dim, n = rows, k = in_dim
 *   din:      din^T [in, rows]   = (W view [in, out], op N) (dout view [out, rows], op N)
 *             m = in_dim, n = rows, k = out_dim
 *   dweight:  dW^T [in, out]     = (in view [in, rows], op N) (dout view [out, rows], op T)
 *             m = in_dim, n = out_dim, k = rows
 *
 * Plans: the descriptors and the algorithm of each (product, shape, operand alignments) are
 * made once and kept in a small table for the life of the process, so a shape always runs
 * the same algorithm (same bits). The algorithm is the one a run's matmul_algorithms table
 * names for the key (runtime/matmul_table.h; `fathom tune` timed cuBLASLt's candidates and
 * wrote it), else cuBLASLt's heuristic's first, best-ranked answer (matmul_rank) under the
 * 32 MiB workspace. beta is not part of the key: it is a run-time argument of
 * cublasLtMatmul that the heuristic is not asked about, so the two modes of din and of
 * dweight share one plan (one algorithm, one order of the sums). Split-K variants whose
 * partial sums would be added in the output type (bf16 for out and din) are excluded: only
 * no split or a reduction in the fp32 compute type. A shape beyond the table's capacity gets
 * a plan made and dropped on every call (the heuristic is deterministic, so the algorithm
 * is the same).
 */
#include "kernels/cuda/cuda_module.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/matmul_internal.h"

#include "runtime/error.h"

#include <cublasLt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum {
    MATMUL_WORKSPACE_BYTES = 32 << 20,
    MATMUL_PLANS_MAX = 128,
    MATMUL_RANKS_MAX = 8, /* FATHOM_MATMUL_RANK's range */
};

static cublasLtHandle_t matmul_handle;
static void *matmul_workspace;
static MatmulPlan matmul_plans[MATMUL_PLANS_MAX];
static int matmul_plan_count;
/* the algorithms a run named (matmul_algorithms; cuda_matmul_table_use), or none */
static MatmulTable matmul_table;

uint32_t matmul_pointer_alignment(const void *pointer)
{
    uintptr_t address = (uintptr_t)pointer;
    uint32_t alignment = 256;
    while (alignment > 1 && address % alignment != 0)
        alignment /= 2;
    return alignment;
}

cublasLtHandle_t matmul_library(void)
{
    cuda_matmul_init();
    return matmul_handle;
}

void *matmul_workspace_memory(void)
{
    cuda_matmul_init();
    return matmul_workspace;
}

int matmul_plan_total(void)
{
    return matmul_plan_count;
}

MatmulPlan *matmul_plan_at(int index)
{
    return &matmul_plans[index];
}

extern "C" void cuda_matmul_init(void)
{
    if (matmul_handle)
        return;
    CUBLAS_CHECK(cublasLtCreate(&matmul_handle));
    CUDA_CHECK(cudaMalloc(&matmul_workspace, MATMUL_WORKSPACE_BYTES));
}

/* The workspace the heuristic may plan for and the products may use: MATMUL_WORKSPACE_BYTES
 * unless FATHOM_MATMUL_WORKSPACE_MIB names less (0 to 32; 0 keeps to algorithms without a
 * workspace). A diagnostic: cuBLASLt sets a flag in its workspace before most products (a
 * memset each, docs/performance.md, 2026-12-02 tenth run), and this is how a run asks what
 * the algorithms that need none cost. Read once. */
uint64_t matmul_workspace_bytes(void)
{
    static int64_t bytes = -1;
    if (bytes < 0) {
        const char *text = getenv("FATHOM_MATMUL_WORKSPACE_MIB");
        char *end = NULL;
        const long mib = text && *text ? strtol(text, &end, 10) : MATMUL_WORKSPACE_BYTES >> 20;
        if (text && *text && (*end || mib < 0 || mib > (MATMUL_WORKSPACE_BYTES >> 20)))
            fatal(EXIT_CONFIG, "FATHOM_MATMUL_WORKSPACE_MIB = '%s' (0 to %d)", text,
                  MATMUL_WORKSPACE_BYTES >> 20);
        bytes = (int64_t)mib << 20;
    }
    return (uint64_t)bytes;
}

static void plans_release(void);

static void plan_release(MatmulPlan *plan)
{
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan->layout_a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan->layout_b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan->layout_c));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan->operation));
}

extern "C" void cuda_matmul_destroy(void)
{
    matmul_table_free(&matmul_table);
    if (!matmul_handle)
        return;
    plans_release();
    CUDA_CHECK(cudaFree(matmul_workspace));
    matmul_workspace = NULL;
    CUBLAS_CHECK(cublasLtDestroy(matmul_handle));
    matmul_handle = NULL;
}

static void set_operation(cublasLtMatmulDesc_t operation, cublasLtMatmulDescAttributes_t which,
                          cublasOperation_t value)
{
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, which, &value, sizeof value));
}

static void set_preference(cublasLtMatmulPreference_t preference,
                           cublasLtMatmulPreferenceAttributes_t which, const void *value,
                           size_t size)
{
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, which, value, size));
}

/* Which of the heuristic's ranked answers a plan takes: 0, its first, unless
 * FATHOM_MATMUL_RANK names another (0 to 7; past the last answer, the last). A diagnostic
 * for comparing cuBLASLt's candidates (launch/bench/layers_gpu.sh); any fixed rank keeps
 * a shape on one algorithm, so runs stay bitwise reproducible. Read once. */
static int matmul_rank(void)
{
    static int rank = -1;
    if (rank < 0) {
        const char *text = getenv("FATHOM_MATMUL_RANK");
        char *end = NULL;
        const long value = text && *text ? strtol(text, &end, 10) : 0;
        if (text && *text && (*end || value < 0 || value >= MATMUL_RANKS_MAX))
            fatal(EXIT_CONFIG, "FATHOM_MATMUL_RANK = '%s' (0 to %d)", text,
                  MATMUL_RANKS_MAX - 1);
        rank = (int)value;
    }
    return rank;
}

/* Fills the descriptors of `plan` (its product, shape and alignments set). */
static void plan_describe(MatmulPlan *plan)
{
    uint64_t rows = (uint64_t)plan->rows, in_dim = (uint64_t)plan->in_dim,
             out_dim = (uint64_t)plan->out_dim;
    cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    switch (plan->product) {
    case MATMUL_FORWARD:
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_a, CUDA_R_16BF, in_dim, out_dim,
                                                (int64_t)in_dim));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_b, CUDA_R_16BF, in_dim, rows,
                                                (int64_t)in_dim));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_c, CUDA_R_16BF, out_dim, rows,
                                                (int64_t)out_dim));
        op_a = CUBLAS_OP_T;
        break;
    case MATMUL_INPUT_GRADIENT:
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_a, CUDA_R_16BF, in_dim, out_dim,
                                                (int64_t)in_dim));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_b, CUDA_R_16BF, out_dim, rows,
                                                (int64_t)out_dim));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_c, CUDA_R_16BF, in_dim, rows,
                                                (int64_t)in_dim));
        break;
    case MATMUL_WEIGHT_GRADIENT:
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_a, CUDA_R_16BF, in_dim, rows,
                                                (int64_t)in_dim));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_b, CUDA_R_16BF, out_dim, rows,
                                                (int64_t)out_dim));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layout_c, CUDA_R_32F, in_dim, out_dim,
                                                (int64_t)in_dim));
        op_b = CUBLAS_OP_T;
        break;
    }
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_operation(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    set_operation(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
}

int matmul_heuristic(const MatmulPlan *plan, cublasLtMatmulHeuristicResult_t *results,
                     int wanted)
{
    cublasLtMatmulPreference_t preference;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace_bytes = matmul_workspace_bytes();
    uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; /* or none: never in bf16 */
    set_preference(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                   sizeof workspace_bytes);
    set_preference(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                   sizeof reduction);
    set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &plan->alignment_a,
                   sizeof plan->alignment_a);
    set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &plan->alignment_b,
                   sizeof plan->alignment_b);
    set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &plan->alignment_c,
                   sizeof plan->alignment_c);
    set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &plan->alignment_c,
                   sizeof plan->alignment_c);
    memset(results, 0, (size_t)wanted * sizeof *results);
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
        matmul_library(), plan->operation, plan->layout_a, plan->layout_b, plan->layout_c,
        plan->layout_c, preference, wanted, results, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    if (found < 1)
        fatal(EXIT_COMM, "cuBLASLt has no algorithm for the matmul %s of rows %d, in %d, out %d "
              "(%s output)", matmul_product_name(plan->product), plan->rows, plan->in_dim,
              plan->out_dim, plan->product == MATMUL_WEIGHT_GRADIENT ? "fp32" : "bf16");
    return found;
}

/* The least alignment of one operand `algorithm` needs (its capability; 1 where the
 * library does not say). */
static uint32_t algorithm_alignment(const cublasLtMatmulAlgo_t *algorithm,
                                    cublasLtMatmulAlgoCapAttributes_t which)
{
    uint32_t bytes = 1;
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(algorithm, which, &bytes, sizeof bytes, &written) !=
        CUBLAS_STATUS_SUCCESS)
        return 1;
    return bytes;
}

bool matmul_algorithm_runs(const MatmulPlan *plan, const cublasLtMatmulAlgo_t *algorithm)
{
    cublasLtMatmulHeuristicResult_t result;
    memset(&result, 0, sizeof result);
    const cublasStatus_t status = cublasLtMatmulAlgoCheck(
        matmul_library(), plan->operation, plan->layout_a, plan->layout_b, plan->layout_c,
        plan->layout_c, algorithm, &result);
    /* the check does not see the pointers: an algorithm (a table's, edited by hand) may need
     * more alignment than the key's operands have */
    return status == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= matmul_workspace_bytes() &&
           algorithm_alignment(algorithm, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES) <=
               plan->alignment_a &&
           algorithm_alignment(algorithm, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES) <=
               plan->alignment_b &&
           algorithm_alignment(algorithm, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES) <=
               plan->alignment_c &&
           algorithm_alignment(algorithm, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES) <=
               plan->alignment_c;
}

/* The table's entry for `plan`'s key, or NULL. */
static const MatmulTableEntry *plan_table_entry(const MatmulPlan *plan)
{
    MatmulTableEntry key;
    memset(&key, 0, sizeof key);
    key.product = plan->product;
    key.rows = plan->rows;
    key.in_dim = plan->in_dim;
    key.out_dim = plan->out_dim;
    key.alignment_a = plan->alignment_a;
    key.alignment_b = plan->alignment_b;
    key.alignment_c = plan->alignment_c;
    return matmul_table_find(&matmul_table, &key);
}

/* Fills the descriptors of `plan` and chooses its algorithm: the table's, where the run named
 * a table with this product (checked with cuBLASLt: an algorithm that does not run here is a
 * config error, not a silent fallback), else the heuristic's. */
static void plan_build(MatmulPlan *plan)
{
    plan_describe(plan);
    const MatmulTableEntry *entry = plan_table_entry(plan);
    if (entry) {
        static_assert(sizeof plan->algorithm == sizeof entry->algorithm,
                      "a table entry holds one cublasLtMatmulAlgo_t");
        memcpy(&plan->algorithm, entry->algorithm, sizeof plan->algorithm);
        if (!matmul_algorithm_runs(plan, &plan->algorithm))
            fatal(EXIT_CONFIG, "matmul_algorithms: the algorithm of the %s of rows %d, in %d, "
                  "out %d does not run on this device and library: run fathom tune again",
                  matmul_product_name(plan->product), plan->rows, plan->in_dim, plan->out_dim);
        plan->from_table = true;
        return;
    }
    cublasLtMatmulHeuristicResult_t results[MATMUL_RANKS_MAX];
    const int found = matmul_heuristic(plan, results, matmul_rank() + 1);
    plan->algorithm = results[matmul_rank() < found ? matmul_rank() : found - 1].algo;
}

static void plans_release(void)
{
    for (int i = 0; i < matmul_plan_count; i++)
        plan_release(&matmul_plans[i]);
    matmul_plan_count = 0;
}

/* Touches no device until plans exist: a run calls this before its backend has chosen the
 * rank's GPU (backend_cuda.cu starts there on its first op). */
extern "C" int cuda_matmul_table_use(const MatmulTable *table, char *why, size_t capacity)
{
    const uint64_t library = (uint64_t)cublasLtGetVersion();
    if (table->library_version != library) {
        snprintf(why, capacity, "it was tuned with cuBLASLt %llu and this CUDA module runs "
                 "%llu (an algorithm is valid for its own library only)",
                 (unsigned long long)table->library_version, (unsigned long long)library);
        return -1;
    }
    if (table->workspace_bytes > matmul_workspace_bytes()) {
        snprintf(why, capacity, "its algorithms may use a workspace of %llu bytes and this "
                 "run allows %llu (FATHOM_MATMUL_WORKSPACE_MIB)",
                 (unsigned long long)table->workspace_bytes,
                 (unsigned long long)matmul_workspace_bytes());
        return -1;
    }
    /* plans made before this call took the heuristic's algorithms: make them again */
    if (matmul_plan_count > 0) {
        CUDA_CHECK(cudaDeviceSynchronize());
        plans_release();
    }
    matmul_table_free(&matmul_table);
    for (int i = 0; i < table->count; i++)
        *matmul_table_add(&matmul_table) = table->entries[i];
    matmul_table.library_version = table->library_version;
    matmul_table.workspace_bytes = table->workspace_bytes;
    matmul_table.multiprocessors = table->multiprocessors;
    memcpy(matmul_table.device, table->device, sizeof matmul_table.device);
    return 0;
}

extern "C" void cuda_matmul_table_counts(int *from_table, int *from_heuristic)
{
    *from_table = *from_heuristic = 0;
    for (int i = 0; i < matmul_plan_count; i++)
        ++*(matmul_plans[i].from_table ? from_table : from_heuristic);
}

/* Runs one product: D = alpha * op(A) op(B) + beta * C, with C = D. A plan is looked up by
 * (product, shape, alignments), or made. */
static void matmul_run(MatmulProduct product, int rows, int in_dim, int out_dim, const void *a,
                       const void *b, void *c, float beta, cudaStream_t stream)
{
    cuda_matmul_init();
    MatmulPlan key;
    memset(&key, 0, sizeof key);
    key.product = product;
    key.rows = rows;
    key.in_dim = in_dim;
    key.out_dim = out_dim;
    key.alignment_a = matmul_pointer_alignment(a);
    key.alignment_b = matmul_pointer_alignment(b);
    key.alignment_c = matmul_pointer_alignment(c);

    MatmulPlan *plan = NULL;
    for (int i = 0; i < matmul_plan_count && !plan; i++) {
        MatmulPlan *candidate = &matmul_plans[i];
        if (candidate->product == product && candidate->rows == rows &&
            candidate->in_dim == in_dim && candidate->out_dim == out_dim &&
            candidate->alignment_a == key.alignment_a &&
            candidate->alignment_b == key.alignment_b &&
            candidate->alignment_c == key.alignment_c)
            plan = candidate;
    }
    bool temporary = false;
    if (!plan) {
        if (matmul_plan_count < MATMUL_PLANS_MAX) {
            plan = &matmul_plans[matmul_plan_count];
        } else {
            plan = &key;
            temporary = true;
        }
        *plan = key;
        plan_build(plan);
        if (!temporary)
            matmul_plan_count++;
    }

    plan->calls++;
    float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(matmul_handle, plan->operation, &alpha, a, plan->layout_a, b,
                                plan->layout_b, &beta, c, plan->layout_c, c, plan->layout_c,
                                &plan->algorithm, matmul_workspace, matmul_workspace_bytes(),
                                stream));
    if (temporary)
        plan_release(plan);
}

extern "C" void cuda_matmul_forward(bf16 *out, const bf16 *in, const bf16 *weight, int rows,
                                    int in_dim, int out_dim, cudaStream_t stream)
{
    if (rows <= 0 || in_dim <= 0 || out_dim <= 0)
        return;
    matmul_run(MATMUL_FORWARD, rows, in_dim, out_dim, weight, in, out, 0.0f, stream);
}

extern "C" void cuda_matmul_backward(bf16 *din, GradMode din_mode, float *dweight,
                                     GradMode dweight_mode, const bf16 *dout, const bf16 *in,
                                     const bf16 *weight, int rows, int in_dim, int out_dim,
                                     cudaStream_t stream)
{
    if (in_dim <= 0)
        return;
    if (rows <= 0 || out_dim <= 0) { /* empty sums: only written gradients change, to zeros */
        if (din && din_mode == GRAD_WRITE && rows > 0)
            CUDA_CHECK(cudaMemsetAsync(din, 0, (size_t)rows * in_dim * sizeof(bf16), stream));
        if (dweight_mode == GRAD_WRITE && out_dim > 0)
            CUDA_CHECK(cudaMemsetAsync(dweight, 0, (size_t)out_dim * in_dim * sizeof(float),
                                       stream));
        return;
    }
    if (din)
        matmul_run(MATMUL_INPUT_GRADIENT, rows, in_dim, out_dim, weight, dout, din,
                   din_mode == GRAD_ADD ? 1.0f : 0.0f, stream);
    matmul_run(MATMUL_WEIGHT_GRADIENT, rows, in_dim, out_dim, in, dout, dweight,
               dweight_mode == GRAD_ADD ? 1.0f : 0.0f, stream);
}
