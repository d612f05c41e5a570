/* tests/test_cuda_attention.c — the cuda attention kernels against the cpu reference
 * (DESIGN 7 "GPU"; kernels/cuda/attention_cuda.h): the default kernels (grouped forward,
 * fused backward) and the two-pass backward on every shape of tests/attention_support.h,
 * accumulate mode, bits across runs, and the shapes refused before any launch. The other
 * variants and the large shapes are in test_cuda_attention_variants.c.
 */
#include "kernels/cuda/attention_cuda.h"
#include "runtime/error.h"
#include "tests/attention_support.h"

#include <criterion/criterion.h>
#include <stddef.h>

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

Test(cuda_attention, unsupported_head_dim_exits_with_the_config_code, .exit_code = EXIT_CONFIG)
{
    attention_forward_cuda(NULL, NULL, NULL, NULL, NULL, 1, 16, 4, 2, 96, 0);
}

Test(cuda_attention, kv_heads_not_dividing_heads_exits_with_the_config_code,
     .exit_code = EXIT_CONFIG)
{
    attention_backward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 16, 6, 4,
                            64, NULL, true, 0);
}
