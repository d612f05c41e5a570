/* tests/test_cuda_route_block_workspace.c — the workspace of the two-phase Route's one-pass
 * backward (kernels/cuda/route_block_backward_cuda.cu, route_block_one_pass_cuda.cu): its
 * dalpha terms and S's partial sums alone, not the coefficients the two passes write.
 * At the 1B step's last blocks it is smaller than those coefficients; at a test shape it is
 * placed before a poisoned guard, which the call must leave as it was, and the gradients are
 * the bits of a call given a workspace of its own. Whether the gradients are right is
 * tests/test_cuda_route_block.c's. SKIPs where no GPU answers.
 */
#include "kernels/cuda/route_block_cuda.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SOURCES = 16, MAX_SITES = 12, GUARD_FLOATS = 1 << 16 };

typedef struct {
    int n_sources, n_sites, tokens, d, heads;
} BlockShape;

/* the delta form's gradients of every source and site, from fixed random inputs; the last
 * source's gradient and the last site's query gradient copied out as bits */
static void one_pass_gradients(BlockShape s, float *workspace, uint32_t *dsource_bits,
                               uint32_t *dquery_bits)
{
    const size_t rows = (size_t)s.tokens * s.d, N = (size_t)s.n_sources;
    const size_t G = (size_t)s.n_sites, per_site = N * s.tokens * s.heads;
    bf16 *dsources[MAX_SOURCES];
    const bf16 *douts[MAX_SITES], *sources[MAX_SOURCES], *queries[MAX_SITES];
    const bf16 *key_norms[MAX_SITES];
    float *dqueries[MAX_SITES], *dkey_norms[MAX_SITES], *dalphas[MAX_SITES];
    const float *weights[MAX_SITES], *alphas[MAX_SITES];
    float *zeros = gpu_test_host_floats((size_t)s.d);
    float *weight_values = gpu_test_rounded_uniform(per_site, 0.05f, 0.1f, 2001);
    float *rstd_values = gpu_test_rounded_uniform(N * s.tokens, 0.2f, 1.0f, 2002);
    const float alpha = 0.5f;
    for (size_t n = 0; n < N; n++) {
        float *source = gpu_test_bf16_values(rows, 1.0f, 2010 + n);
        dsources[n] = gpu_poisoned_bf16(rows); /* every one written: the mask below */
        sources[n] = gpu_upload_bf16(source, rows);
        free(source);
    }
    for (size_t i = 0; i < G; i++) {
        float *dout = gpu_test_bf16_values(rows, 1.0f, 2030 + i);
        float *query = gpu_test_bf16_values((size_t)s.d, 0.3f, 2050 + i);
        float *key_norm = gpu_test_rounded_uniform((size_t)s.d, 0.5f, 1.0f, 2070 + i);
        douts[i] = gpu_upload_bf16(dout, rows);
        queries[i] = gpu_upload_bf16(query, (size_t)s.d);
        key_norms[i] = gpu_upload_bf16(key_norm, (size_t)s.d);
        dqueries[i] = gpu_upload_floats(zeros, (size_t)s.d);
        dkey_norms[i] = gpu_upload_floats(zeros, (size_t)s.d);
        dalphas[i] = gpu_upload_floats(zeros, 1);
        weights[i] = gpu_upload_floats(weight_values, per_site);
        alphas[i] = gpu_upload_floats(&alpha, 1);
        free(dout), free(query), free(key_norm);
    }
    const float *rstd = gpu_upload_floats(rstd_values, N * s.tokens);
    cuda_route_block_backward(dsources, (1u << N) - 1, dqueries, dkey_norms, dalphas, douts,
                              sources, s.n_sources, weights, rstd, queries, key_norms, alphas,
                              NULL, s.n_sites, workspace, s.tokens, s.d, s.heads, 0);
    float *got = gpu_download_bf16(dsources[N - 1], rows);
    memcpy(dsource_bits, got, rows * sizeof(float));
    free(got);
    got = gpu_download_floats(dqueries[G - 1], (size_t)s.d);
    memcpy(dquery_bits, got, (size_t)s.d * sizeof(float));
    free(got);
    free(zeros), free(weight_values), free(rstd_values);
}

Test(cuda_route_block_workspace, the_one_pass_keeps_inside_a_workspace_without_coefficients)
{
    gpu_require();
    setenv("FATHOM_ROUTE_BLOCK", "mma_all", 1);
    const BlockShape step = {9, 8, 8192, 1280, 8}; /* the 1B step's last blocks */
    const size_t coefficients =
        (size_t)step.tokens * step.n_sources * step.heads * 2 * step.n_sites;
    const size_t step_floats = cuda_route_block_backward_workspace_floats(
        step.n_sources, step.n_sites, step.tokens, step.d, step.heads);
    cr_expect_lt(step_floats, coefficients, "%zu floats", step_floats);

    const BlockShape s = {9, 8, 700, 1280, 8}; /* tokens that are multiples of nothing */
    const CudaRouteBlockLayout layout = cuda_route_block_layout(9, 8, 1280, 8);
    cr_assert_str_eq(layout.backward, "one_pass");
    const size_t floats =
        cuda_route_block_backward_workspace_floats(s.n_sources, s.n_sites, s.tokens, s.d, s.heads);
    float *guarded = gpu_poisoned_floats(floats + GUARD_FLOATS);
    const size_t rows = (size_t)s.tokens * s.d;
    uint32_t *dsource_bits = malloc(2 * rows * sizeof(uint32_t));
    uint32_t *dquery_bits = malloc(2 * (size_t)s.d * sizeof(uint32_t));
    one_pass_gradients(s, guarded, dsource_bits, dquery_bits);
    one_pass_gradients(s, gpu_poisoned_floats(floats), dsource_bits + rows, dquery_bits + s.d);
    cr_expect_arr_eq(dsource_bits, dsource_bits + rows, rows * sizeof(uint32_t));
    cr_expect_arr_eq(dquery_bits, dquery_bits + s.d, (size_t)s.d * sizeof(uint32_t));
    float *guard = gpu_download_floats(guarded + floats, GUARD_FLOATS);
    size_t written = 0;
    for (size_t k = 0; k < GUARD_FLOATS; k++) {
        uint32_t bits;
        memcpy(&bits, &guard[k], sizeof bits);
        written += bits != 0xFFFFFFFFu;
    }
    cr_expect_eq(written, 0, "%zu floats past the workspace were written", written);
    free(guard), free(dsource_bits), free(dquery_bits);
    gpu_free_all();
}
