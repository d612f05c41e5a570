/* tests/test_cuda_route_block_layout.c — which block route kernels FATHOM_ROUTE_BLOCK selects
 * and the layout they take at a shape (kernels/cuda/route_block_cuda.h; no GPU needed: the
 * choice is made on the host). Each test runs in a process of its own, so the variable, read
 * once a process, is read anew. The kernels' results are tests/test_cuda_route_block.c's.
 */
#include "kernels/cuda/route_block_cuda.h"
#include "runtime/error.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* the split layout too since it was timed (1B MSAR step 999.5 -> 918.6 ms, one H200) */
Test(cuda_route_block_layout, the_tensor_core_kernels_and_the_split_layout_are_the_default)
{
    unsetenv("FATHOM_ROUTE_BLOCK");
    cr_expect(cuda_route_block_tensor_cores());
    cr_expect(cuda_route_block_split_heads());
}

Test(cuda_route_block_layout, simt_names_the_per_thread_kernels)
{
    setenv("FATHOM_ROUTE_BLOCK", "simt", 1);
    cr_expect_not(cuda_route_block_tensor_cores());
    cr_expect_not(cuda_route_block_split_heads());
}

Test(cuda_route_block_layout, mma_names_the_tensor_core_kernels)
{
    setenv("FATHOM_ROUTE_BLOCK", "mma", 1);
    cr_expect(cuda_route_block_tensor_cores());
    cr_expect_not(cuda_route_block_split_heads());
}

Test(cuda_route_block_layout, mma_all_names_the_tensor_core_kernels_and_the_split_layout)
{
    setenv("FATHOM_ROUTE_BLOCK", "mma_all", 1);
    cr_expect(cuda_route_block_tensor_cores());
    cr_expect(cuda_route_block_split_heads());
}

static void select_kernels_named_fastest(void *unused)
{
    (void)unused;
    setenv("FATHOM_ROUTE_BLOCK", "fastest", 1);
    cuda_route_block_tensor_cores();
}

Test(cuda_route_block_layout, an_unknown_kernel_name_exits_with_the_config_code)
{
    test_expect_fatal(select_kernels_named_fastest, NULL, EXIT_CONFIG,
                      "FATHOM_ROUTE_BLOCK = 'fastest' (mma_all, mma or simt)");
}

/* the layout of a call (N sources, G sites, d, H) and what it should be */
typedef struct {
    int n_sources, n_sites, d, heads;
    const char *kernels;
    int threads, warp_vectors, k_steps;
} LayoutCase;

/* each case's layout under FATHOM_ROUTE_BLOCK = choice */
static void expect_layouts(const char *choice, const LayoutCase *cases, int count)
{
    setenv("FATHOM_ROUTE_BLOCK", choice, 1);
    for (int i = 0; i < count; i++) {
        const LayoutCase *c = &cases[i];
        const CudaRouteBlockLayout got =
            cuda_route_block_layout(c->n_sources, c->n_sites, c->d, c->heads);
        cr_expect_str_eq(got.kernels, c->kernels, "N %d G %d d %d H %d: %s", c->n_sources,
                         c->n_sites, c->d, c->heads, got.kernels);
        cr_expect_eq(got.threads, c->threads, "d %d H %d: %d threads", c->d, c->heads,
                     got.threads);
        cr_expect_eq(got.warp_vectors, c->warp_vectors, "d %d H %d: %d vectors a warp", c->d,
                     c->heads, got.warp_vectors);
        cr_expect_eq(got.k_steps, c->k_steps, "d %d H %d: %d k-steps", c->d, c->heads,
                     got.k_steps);
    }
}

#define COUNT(array) ((int)(sizeof array / sizeof array[0]))

/* Heads of whole warps (8B graft: d 4096 H 8, 16 warps) on tensor cores; heads inside warps
 * (the 1B graft: d 1280 H 8; head_dim 80, 8 and a row of 24) per thread, a thread a vector;
 * past the block kernels' limits (13 sources, 9 sites, head_dim 4, d 8192) the per-site
 * kernels. */
Test(cuda_route_block_layout, mma_splits_no_head)
{
    const LayoutCase cases[] = {
        {9, 8, 4096, 8, "mma", 512, 32, 16},   {3, 4, 4096, 1, "mma", 512, 32, 16},
        {9, 8, 1280, 8, "simt", 160, 32, 0},   {5, 4, 1280, 16, "simt", 160, 32, 0},
        {3, 3, 1024, 8, "simt", 128, 32, 0},   {2, 3, 256, 32, "simt", 32, 32, 0},
        {4, 2, 24, 3, "simt", 32, 32, 0},      {13, 2, 256, 8, "per_site", 0, 0, 0},
        {3, 9, 256, 2, "per_site", 0, 0, 0},   {2, 3, 256, 64, "per_site", 0, 0, 0},
        {2, 2, 8192, 8, "per_site", 0, 0, 0},
    };
    expect_layouts("mma", cases, COUNT(cases));
}

/* The split layout: a warp of 20 vectors a head at the 1B graft (eight warps, 256 threads for
 * 160 vectors; N up to 12), two warps of 20 for a head of 40 vectors (d 640 H 2), three of 24
 * for 72 (d 1152 H 2), 16 (head_dim 128) and 24 (192); not where a warp would hold 10
 * vectors (head_dim 80: k-steps odd and too few), 1 (head_dim 8) or 18 (a head of 36
 * vectors, d 576 H 2), nor past 512 threads (d 4096 H 32: 32 warps of 16), nor where its 32
 * slots a warp would not fit shared memory (d 2560 H 8: 16 warps of 20, whose dots at N 11
 * and G 8 need 240 KB; the row layout's 150 KB); heads of whole warps as under mma. */
Test(cuda_route_block_layout, mma_all_splits_heads_into_warps_of_16_to_24_vectors)
{
    const LayoutCase cases[] = {
        {9, 8, 1280, 8, "mma_split", 256, 20, 10},  {12, 8, 1280, 8, "mma_split", 256, 20, 10},
        {4, 2, 640, 2, "mma_split", 128, 20, 10},   {5, 4, 1152, 2, "mma_split", 192, 24, 12},
        {9, 8, 1024, 8, "mma_split", 256, 16, 8},   {7, 5, 1536, 8, "mma_split", 256, 24, 12},
        {5, 4, 1280, 16, "simt", 160, 32, 0},       {2, 3, 256, 32, "simt", 32, 32, 0},
        {2, 2, 576, 2, "simt", 96, 32, 0},          {2, 2, 4096, 32, "simt", 512, 32, 0},
        {11, 8, 2560, 8, "simt", 320, 32, 0},       {10, 8, 2560, 8, "mma_split", 512, 20, 10},
        {9, 8, 4096, 8, "mma", 512, 32, 16},        {6, 7, 2048, 8, "mma", 256, 32, 16},
        {13, 2, 1280, 8, "per_site", 0, 0, 0},
    };
    expect_layouts("mma_all", cases, COUNT(cases));
}

Test(cuda_route_block_layout, simt_splits_no_head)
{
    const LayoutCase cases[] = {
        {9, 8, 4096, 8, "simt", 512, 32, 0},
        {9, 8, 1280, 8, "simt", 160, 32, 0},
    };
    expect_layouts("simt", cases, COUNT(cases));
}

/* The backward walker's grid: one wave of the blocks that fit a multiprocessor at the
 * shape's staging (G + 2N rows of the block's channel slice, two stages, and the
 * coefficients of the heads its channels touch), on 132 multiprocessors, whatever the GPU.
 * At d 1280 the slices are two of 640 channels (160 threads; three of 512 left the last
 * half idle), at most 3 a multiprocessor at 128 registers: 3 up to N 9 (72 KB at N 9), 2
 * at N 12 (89 KB). At d 4096 with H 8 (a block a head) slices of 512: 54 KB at N 9, 4 fit,
 * and 60 KB at N 10, 3. The grid is never more than the wave and short of it by fewer
 * blocks than a token range has (a block a channel slice). */
Test(cuda_route_block_layout, the_walker_grid_is_one_wave_of_the_blocks_that_fit)
{
    unsetenv("FATHOM_ROUTE_BLOCK");
    const struct {
        int n_sources, n_sites, d, heads, threads, resident, slices;
    } cases[] = {
        {2, 8, 1280, 8, 160, 3, 2},  {6, 8, 1280, 8, 160, 3, 2}, {9, 8, 1280, 8, 160, 3, 2},
        {12, 8, 1280, 8, 160, 2, 2}, {5, 4, 4096, 8, 128, 4, 8}, {9, 8, 4096, 8, 128, 4, 8},
        {10, 8, 4096, 8, 128, 3, 8}, {3, 4, 4096, 1, 128, 4, 8}, {4, 8, 2048, 16, 128, 4, 4},
        {4, 8, 768, 6, 128, 4, 2},
    };
    for (int i = 0; i < COUNT(cases); i++) {
        const CudaRouteBlockLayout got = cuda_route_block_layout(
            cases[i].n_sources, cases[i].n_sites, cases[i].d, cases[i].heads);
        const int wave = 132 * cases[i].resident;
        cr_expect_eq(got.walk_threads, cases[i].threads, "d %d: %d threads a walker block",
                     cases[i].d, got.walk_threads);
        cr_expect_eq(got.walk_resident, cases[i].resident, "N %d G %d d %d: %d a multiprocessor",
                     cases[i].n_sources, cases[i].n_sites, cases[i].d, got.walk_resident);
        cr_expect(got.walk_blocks <= wave && got.walk_blocks > wave - cases[i].slices,
                  "N %d G %d d %d: %d blocks for a wave of %d", cases[i].n_sources,
                  cases[i].n_sites, cases[i].d, got.walk_blocks, wave);
        cr_expect_eq(got.walk_blocks % cases[i].slices, 0, "d %d: %d blocks in %d slices",
                     cases[i].d, got.walk_blocks, cases[i].slices);
    }
}

/* The backward in one pass where each warp's dots are one whole head (the split layout),
 * there are 5 sources or more and the staging fits: the 1B model's d 1280 H 8 up to N 12 at
 * G 8, head_dim 128 and 192; the two passes elsewhere (fewer sources, heads of several
 * warps, the row layout, a head's warp of 32 vectors, more than 8 heads), under
 * FATHOM_ROUTE_BLOCK=mma (no split layout), and everywhere under
 * FATHOM_ROUTE_BLOCK_BACKWARD=two_pass. */
static const struct {
    int n_sources, n_sites, d, heads;
    const char *backward;
} backward_cases[] = {
    {9, 8, 1280, 8, "one_pass"},  {12, 8, 1280, 8, "one_pass"}, {5, 4, 1280, 8, "one_pass"},
    {4, 8, 1280, 8, "two_pass"},  {2, 4, 1280, 8, "two_pass"},
    {9, 8, 1024, 8, "one_pass"},  {12, 8, 1536, 8, "one_pass"}, {9, 8, 4096, 8, "two_pass"},
    {9, 4, 640, 2, "two_pass"},   {6, 7, 2048, 8, "two_pass"},  {5, 4, 1280, 16, "two_pass"},
    {4, 8, 2048, 16, "two_pass"},
};

static void expect_backward(const char *kernels, const char *passes, bool every_two)
{
    setenv("FATHOM_ROUTE_BLOCK", kernels, 1);
    if (passes)
        setenv("FATHOM_ROUTE_BLOCK_BACKWARD", passes, 1);
    else
        unsetenv("FATHOM_ROUTE_BLOCK_BACKWARD");
    for (int i = 0; i < COUNT(backward_cases); i++) {
        const CudaRouteBlockLayout got =
            cuda_route_block_layout(backward_cases[i].n_sources, backward_cases[i].n_sites,
                                    backward_cases[i].d, backward_cases[i].heads);
        const char *want = every_two ? "two_pass" : backward_cases[i].backward;
        cr_expect_str_eq(got.backward, want, "N %d G %d d %d H %d: %s",
                         backward_cases[i].n_sources, backward_cases[i].n_sites,
                         backward_cases[i].d, backward_cases[i].heads, got.backward);
    }
}

Test(cuda_route_block_layout, the_backward_takes_one_pass_where_a_warp_is_a_head)
{
    expect_backward("mma_all", NULL, false);
}

Test(cuda_route_block_layout, the_backward_takes_one_pass_only_in_the_split_layout)
{
    expect_backward("mma", NULL, true);
}

Test(cuda_route_block_layout, two_pass_keeps_the_backward_in_two_passes)
{
    expect_backward("mma_all", "two_pass", true);
}
