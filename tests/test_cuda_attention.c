/* tests/test_cuda_attention.c — the cuda attention kernels against the cpu reference
 * (DESIGN 7 "GPU"; kernels/cuda/attention_cuda.h): the default kernels (grouped forward,
 * fused backward) and the two-pass backward on every shape of tests/attention_support.h,
 * accumulate mode, bits across runs, and the shapes refused before any launch. The other
 * variants and the large shapes are in test_cuda_attention_variants.c.
 */
#include "kernels/cuda/attention_backward_internal.h"
#include "kernels/cuda/attention_cuda.h"
#include "runtime/error.h"
#include "tests/attention_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

Test(cuda_attention, forward_matches_cpu_for_a_single_token)
{
    attention_check_forward(single_token, 101, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, forward_matches_cpu_with_grouped_heads_and_a_ragged_tail)
{
    attention_check_forward(grouped_ragged_64, 102, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, forward_matches_cpu_for_head_dim_128_past_two_query_tiles)
{
    attention_check_forward(grouped_ragged_128, 103, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, forward_matches_cpu_for_head_dim_80)
{
    attention_check_forward(grouped_ragged_80, 104, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, forward_matches_cpu_with_32_heads_over_8_kv_heads)
{
    attention_check_forward(wide_128, 105, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, forward_matches_cpu_without_grouped_heads)
{
    attention_check_forward(ungrouped_64, 106, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, forward_matches_cpu_over_many_key_blocks)
{
    attention_check_forward(long_64, 107, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, forward_matches_cpu_with_groups_of_eight_heads)
{
    attention_check_forward(groups_of_8_128, 108, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, forward_matches_cpu_with_groups_of_three_heads)
{
    attention_check_forward(groups_of_3_80, 109, ATTENTION_FORWARD_GROUPED);
}

Test(cuda_attention, backward_matches_cpu_for_a_single_token)
{
    attention_check_backward(single_token, 201, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, backward_matches_cpu_with_grouped_heads_and_a_ragged_tail)
{
    attention_check_backward(grouped_ragged_64, 202, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, backward_matches_cpu_for_head_dim_128_past_two_query_tiles)
{
    attention_check_backward(grouped_ragged_128, 203, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, backward_matches_cpu_for_head_dim_80)
{
    attention_check_backward(grouped_ragged_80, 204, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, backward_matches_cpu_with_32_heads_over_8_kv_heads)
{
    attention_check_backward(wide_128, 205, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, backward_matches_cpu_without_grouped_heads)
{
    attention_check_backward(ungrouped_64, 206, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, backward_matches_cpu_over_many_key_blocks)
{
    attention_check_backward(long_64, 207, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, backward_matches_cpu_with_groups_of_eight_heads)
{
    attention_check_backward(groups_of_8_128, 208, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, backward_matches_cpu_with_groups_of_three_heads)
{
    attention_check_backward(groups_of_3_80, 209, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, two_pass_backward_matches_cpu_with_grouped_heads_and_a_ragged_tail)
{
    attention_check_backward(grouped_ragged_64, 212, ATTENTION_BACKWARD_TWO_PASS);
}

Test(cuda_attention, two_pass_backward_matches_cpu_for_head_dim_80)
{
    attention_check_backward(grouped_ragged_80, 214, ATTENTION_BACKWARD_TWO_PASS);
}

Test(cuda_attention, two_pass_backward_matches_cpu_with_32_heads_over_8_kv_heads)
{
    attention_check_backward(wide_128, 215, ATTENTION_BACKWARD_TWO_PASS);
}

Test(cuda_attention, backward_with_accumulate_adds_to_the_gradients)
{
    attention_check_accumulate(ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, two_pass_backward_with_accumulate_adds_to_the_gradients)
{
    attention_check_accumulate(ATTENTION_BACKWARD_TWO_PASS);
}

Test(cuda_attention, backward_is_bitwise_deterministic)
{
    attention_check_deterministic(ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, two_pass_backward_is_bitwise_deterministic)
{
    attention_check_deterministic(ATTENTION_BACKWARD_TWO_PASS);
}

/* Shapes the kernels cannot run are refused before any launch (no GPU needed). */
static void attention_with_head_dim_96(void *unused)
{
    (void)unused;
    attention_forward_cuda(NULL, NULL, NULL, NULL, NULL, 1, 16, 4, 2, 96, 0);
}

Test(cuda_attention, unsupported_head_dim_exits_with_the_config_code)
{
    test_expect_fatal(attention_with_head_dim_96, NULL, EXIT_CONFIG,
                      "model.head_dim = 96 is not supported on cuda");
}

static void attention_backward_with_4_kv_heads_for_6(void *unused)
{
    (void)unused;
    attention_backward_cuda(NULL, NULL, NULL, GRAD_ADD, NULL, NULL, NULL, NULL, NULL, NULL, 1,
                            16, 6, 4, 64, NULL, 0);
}

Test(cuda_attention, kv_heads_not_dividing_heads_exits_with_the_config_code)
{
    test_expect_fatal(attention_backward_with_4_kv_heads_for_6, NULL, EXIT_CONFIG,
                      "model.n_kv_heads = 4 must divide model.n_heads = 6");
}

/* The kernel selectors (no GPU needed): each test runs in a fresh process, so the variables
 * are read anew. */
Test(cuda_attention, kernels_default_to_the_persistent_forward_and_the_tma_backward)
{
    unsetenv("FATHOM_ATTENTION_FORWARD");
    unsetenv("FATHOM_ATTENTION_BACKWARD");
    cr_expect_eq(attention_cuda_forward_kernel(), ATTENTION_FORWARD_PERSISTENT);
    cr_expect_eq(attention_cuda_backward_kernel(), ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, environment_variables_name_the_other_kernels)
{
    setenv("FATHOM_ATTENTION_FORWARD", "grouped", 1);
    setenv("FATHOM_ATTENTION_BACKWARD", "fused", 1);
    cr_expect_eq(attention_cuda_forward_kernel(), ATTENTION_FORWARD_GROUPED);
    cr_expect_eq(attention_cuda_backward_kernel(), ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, single_consumer_names_the_specialised_forward_with_one_consumer)
{
    setenv("FATHOM_ATTENTION_FORWARD", "single_consumer", 1);
    cr_expect_eq(attention_cuda_forward_kernel(), ATTENTION_FORWARD_SINGLE_CONSUMER);
}

Test(cuda_attention, specialised_names_the_forward_of_one_cta_a_tile)
{
    setenv("FATHOM_ATTENTION_FORWARD", "specialised", 1);
    cr_expect_eq(attention_cuda_forward_kernel(), ATTENTION_FORWARD_SPECIALISED);
}

static void select_backward_named_fastest(void *unused)
{
    (void)unused;
    setenv("FATHOM_ATTENTION_BACKWARD", "fastest", 1);
    attention_cuda_backward_kernel();
}

Test(cuda_attention, an_unknown_backward_name_exits_with_the_config_code)
{
    test_expect_fatal(select_backward_named_fastest, NULL, EXIT_CONFIG,
                      "FATHOM_ATTENTION_BACKWARD = 'fastest'");
}

static void select_forward_named_fastest(void *unused)
{
    (void)unused;
    setenv("FATHOM_ATTENTION_FORWARD", "fastest", 1);
    attention_cuda_forward_kernel();
}

Test(cuda_attention, an_unknown_forward_name_exits_with_the_config_code)
{
    test_expect_fatal(select_forward_named_fastest, NULL, EXIT_CONFIG,
                      "FATHOM_ATTENTION_FORWARD = 'fastest'");
}

/* delta, then the semaphores with the counter behind them, then a 64 x head_dim fp32 dq tile
 * per (batch, head, 64-query block): disjoint, each part 256-byte aligned; the two-pass
 * kernels need delta alone. */
Test(cuda_attention, backward_workspace_parts_are_disjoint_aligned_and_sized)
{
    const int B = 2, T = 77, heads = 6, head_dim = 80, query_blocks = 2;
    char *base = (char *)(uintptr_t)0x100000;
    AttentionBackwardWorkspace w = attention_backward_workspace(base, B, T, heads, head_dim, 1);
    size_t rows = (size_t)B * heads;
    cr_expect_eq((char *)w.delta, base);
    cr_expect_geq((char *)w.semaphores, (char *)(w.delta + rows * T));
    cr_expect_eq(w.counter, w.semaphores + rows * query_blocks);
    cr_expect_eq(w.zeroed_words, rows * query_blocks + 1);
    cr_expect_geq((char *)w.dq_accum, (char *)(w.counter + 1));
    cr_expect_eq((uintptr_t)w.semaphores % 256, 0);
    cr_expect_eq((uintptr_t)w.dq_accum % 256, 0);
    cr_expect_eq(base + w.bytes,
                 (char *)(w.dq_accum + rows * query_blocks * 64 * (size_t)head_dim));
    AttentionBackwardWorkspace two_pass =
        attention_backward_workspace(base, B, T, heads, head_dim, 0);
    cr_expect_null(two_pass.semaphores);
    cr_expect_eq(two_pass.bytes, (rows * T * sizeof(float) + 255) / 256 * 256);
}
