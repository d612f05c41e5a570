/* tests/test_cuda_mix_sites.c — the mix's backward of a block's sites in one launch
 * (cuda_stream_mix_backward_sites, kernels/cuda/stream_cuda.cu; the delta form's block
 * backward takes a stream at a time, model/route_block.c): against cuda_stream_mix_backward
 * a site at a time with stream r alone given, bit for bit: d o_r (written; poisoned first),
 * d theta, d beta and d alpha (added into the same starting values). Shapes: the 1B width
 * (d 1280, m 4, 8 sites, the gate), 10 sites (two launches) without the gate, a width the
 * warp-a-token kernels do not take (d 96: the sites in turn). Each test SKIPs where no GPU
 * answers.
 */
#include "kernels/cuda/route_cuda.h"
#include "tests/gpu_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SITES = 10 };

typedef struct {
    int tokens, d, m, sites, r;
    bool gated;
} SitesShape;

/* One site's inputs (device) and, for the two calls (a site at a time, the op), its
 * outputs */
typedef struct {
    bf16 *dout, *stream, *mix_proj;
    float *gates, *rstd, *mix_bias, *alpha;
    bf16 *dstream_of[2];
    float *dmix_bias_of[2], *dmix_proj_of[2], *dalpha_of[2];
} Site;

static void site_make(Site *site, const SitesShape *s, uint64_t seed)
{
    const size_t row = (size_t)s->tokens * s->d, gates = (size_t)s->tokens * s->m;
    const size_t proj = (size_t)s->m * s->d;
    float *values[8] = {
        gpu_test_bf16_values(row, 1.0f, seed + 1),
        gpu_test_bf16_values(row, 1.0f, seed + 2),
        gpu_test_bf16_values(proj, 0.5f, seed + 3),
        gpu_test_rounded_uniform(gates, 0.45f, 0.5f, seed + 4),
        gpu_test_rounded_uniform(gates, 0.5f, 1.0f, seed + 5),
        gpu_test_fp32_values((size_t)s->m, 1.0f, seed + 6),
        gpu_test_fp32_values(proj, 0.1f, seed + 7),
        gpu_test_fp32_values((size_t)s->m + 2, 0.5f, seed + 8),
    };
    site->dout = gpu_upload_bf16(values[0], row);
    site->stream = gpu_upload_bf16(values[1], row);
    site->mix_proj = gpu_upload_bf16(values[2], proj);
    site->gates = gpu_upload_floats(values[3], gates);
    site->rstd = gpu_upload_floats(values[4], gates);
    site->mix_bias = gpu_upload_floats(values[5], (size_t)s->m);
    site->alpha = s->gated ? gpu_upload_floats(values[7] + s->m, 1) : NULL;
    for (int k = 0; k < 2; k++) {
        site->dstream_of[k] = gpu_poisoned_bf16(row);
        site->dmix_bias_of[k] = gpu_upload_floats(values[7], (size_t)s->m);
        site->dmix_proj_of[k] = gpu_upload_floats(values[6], proj);
        site->dalpha_of[k] = gpu_upload_floats(values[7] + s->m + 1, 1);
    }
    for (int k = 0; k < 8; k++)
        free(values[k]);
}

/* the downloads of the op equal those of a site at a time bit for bit */
static void expect_same_bits(const float *got, const float *want, size_t n, const char *what,
                             int shape, int site)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            cr_assert_fail("shape %d site %d: %s[%zu] is %a, a site at a time gives %a", shape,
                           site, what, i, got[i], want[i]);
}

static void check_sites(const SitesShape *s, int index, uint64_t seed)
{
    Site site[MAX_SITES];
    for (int i = 0; i < s->sites; i++)
        site_make(&site[i], s, seed * 100 + 10 * (uint64_t)i);
    float *workspace = gpu_poisoned_floats(
        cuda_stream_mix_backward_sites_workspace_floats(s->sites, s->m, s->tokens, s->d));
    /* copy 0: a site at a time */
    for (int i = 0; i < s->sites; i++) {
        const bf16 *streams[CUDA_STREAM_MAX_STREAMS] = {0};
        bf16 *dstreams[CUDA_STREAM_MAX_STREAMS] = {0};
        streams[s->r] = site[i].stream;
        dstreams[s->r] = site[i].dstream_of[0];
        cuda_stream_mix_backward(dstreams, GRAD_WRITE, site[i].dmix_bias_of[0],
                                 site[i].dmix_proj_of[0], site[i].dalpha_of[0], site[i].dout,
                                 streams, s->m, site[i].gates, site[i].rstd, site[i].mix_bias,
                                 site[i].mix_proj, site[i].alpha, s->tokens, s->d, workspace, 0);
    }
    /* copy 1: the op */
    bf16 *dstream[MAX_SITES], *mix_proj[MAX_SITES];
    const bf16 *dout[MAX_SITES], *stream[MAX_SITES];
    float *dmix_bias[MAX_SITES], *dmix_proj[MAX_SITES], *dalpha[MAX_SITES];
    const float *gates[MAX_SITES], *rstd[MAX_SITES], *alpha[MAX_SITES];
    for (int i = 0; i < s->sites; i++) {
        dstream[i] = site[i].dstream_of[1], mix_proj[i] = site[i].mix_proj;
        dout[i] = site[i].dout, stream[i] = site[i].stream;
        dmix_bias[i] = site[i].dmix_bias_of[1], dmix_proj[i] = site[i].dmix_proj_of[1];
        dalpha[i] = site[i].dalpha_of[1];
        gates[i] = site[i].gates, rstd[i] = site[i].rstd, alpha[i] = site[i].alpha;
    }
    cuda_stream_mix_backward_sites(s->sites, s->r, s->m, dstream, dmix_bias, dmix_proj, dalpha,
                                   dout, stream, gates, rstd, (const bf16 *const *)mix_proj,
                                   alpha, s->tokens, s->d, workspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    const size_t row = (size_t)s->tokens * s->d, proj = (size_t)s->m * s->d;
    for (int i = 0; i < s->sites; i++) {
        float *got[2][4];
        for (int k = 0; k < 2; k++) {
            got[k][0] = gpu_download_bf16(site[i].dstream_of[k], row);
            got[k][1] = gpu_download_floats(site[i].dmix_bias_of[k], (size_t)s->m);
            got[k][2] = gpu_download_floats(site[i].dmix_proj_of[k], proj);
            got[k][3] = gpu_download_floats(site[i].dalpha_of[k], 1);
        }
        cr_assert(test_all_finite(got[1][0], row), "shape %d site %d: d o_r left unwritten",
                  index, i);
        const char *names[4] = {"d o_r", "d beta", "d theta", "d alpha"};
        const size_t sizes[4] = {row, (size_t)s->m, proj, 1};
        for (int q = 0; q < 4; q++)
            expect_same_bits(got[1][q], got[0][q], sizes[q], names[q], index, i);
        for (int k = 0; k < 2; k++)
            for (int q = 0; q < 4; q++)
                free(got[k][q]);
    }
    gpu_free_all();
}

Test(cuda_mix_sites, a_blocks_sites_at_once_have_the_bits_of_a_site_at_a_time)
{
    gpu_require();
    static const SitesShape shapes[] = {
        {1000, 1280, 4, 8, 2, true},  /* the 1B width's block, the delta gate */
        {300, 512, 3, 10, 0, false},  /* two launches, no gate */
        {77, 96, 2, 3, 1, true},      /* rows the warp-a-token kernels do not take */
    };
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        cr_log_info("mix sites shape %d", i);
        check_sites(&shapes[i], i, 9000 + 31 * (uint64_t)i);
    }
}
