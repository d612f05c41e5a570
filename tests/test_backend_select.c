/* tests/test_backend_select.c — which networks the cuda backend takes (launch/backend_select.h):
 * `device: auto` must fall back to the cpu, and `device: cuda` must refuse with the reason,
 * before a kernel meets a shape it cannot run. No GPU needed: the compute capability is
 * given. */
#include <criterion/criterion.h>
#include <string.h>

#include "launch/backend_select.h"
#include "runtime/config.h"

enum { HOPPER = 90, AMPERE = 80 };

static Config llama_head_dim(int head_dim)
{
    Config config;
    config_defaults(&config);
    config.model.head_dim = head_dim;
    return config;
}

static void expect_refused(const Config *config, int capability, const char *reason)
{
    char why[256] = "";
    cr_assert_not(backend_cuda_takes(config, capability, why, sizeof why));
    cr_assert_not_null(strstr(why, reason), "expected '%s' in: %s", reason, why);
}

Test(backend_select, cuda_takes_head_dims_64_80_and_128_on_hopper)
{
    char why[256];
    for (int head_dim = 64; head_dim <= 128; head_dim += 16) {
        Config config = llama_head_dim(head_dim);
        const bool expected = head_dim == 64 || head_dim == 80 || head_dim == 128;
        cr_expect_eq(backend_cuda_takes(&config, HOPPER, why, sizeof why), expected,
                     "head_dim %d", head_dim);
    }
}

Test(backend_select, the_demo_head_dim_is_refused_naming_the_key)
{
    Config config = llama_head_dim(32);
    expect_refused(&config, HOPPER, "model.head_dim");
}

Test(backend_select, a_gpu_before_hopper_is_refused_for_the_attention)
{
    Config config = llama_head_dim(128);
    expect_refused(&config, AMPERE, "Hopper");
    expect_refused(NULL, AMPERE, "Hopper"); /* fathom bench: no network, still the GPU */
}

Test(backend_select, width_routing_heads_and_stream_kernels_beyond_the_kernels_are_refused)
{
    Config config = llama_head_dim(128);
    config.model.d_model = 8192 + 128;
    expect_refused(&config, HOPPER, "model.d_model");

    config = llama_head_dim(128);
    config.residual.mode = RESIDUAL_ATTNRES;
    config.residual.heads = 64;
    expect_refused(&config, HOPPER, "residual.heads");

    config = llama_head_dim(128);
    config.residual.mode = RESIDUAL_MSAR;
    config.residual.streams = 2;
    config.residual.n_stream_kernels = 2;
    config.residual.stream_kernels[0] = 1;
    config.residual.stream_kernels[1] = 9;
    expect_refused(&config, HOPPER, "residual.stream_kernels");
}
