/* tests/test_cuda_attention_variants.c — the attention kernels beside the first ones (the
 * specialised forward, persistent or not, the fused backward through TMA) against the cpu
 * reference on the shapes of tests/attention_support.h, and every new kernel at the
 * Llama-3-8B and 1B shapes against the earlier kernels and against its own bits.
 */
#include "kernels/cuda/attention_cuda.h"
#include "tests/attention_support.h"
#include "tests/gpu_support.h"

#include <criterion/criterion.h>
#include <stddef.h>

Test(cuda_attention, specialised_forward_matches_cpu_for_a_single_token)
{
    attention_check_forward(single_token, 111, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_cpu_with_grouped_heads_and_a_ragged_tail)
{
    attention_check_forward(grouped_ragged_64, 112, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_cpu_for_head_dim_128_past_two_query_tiles)
{
    attention_check_forward(grouped_ragged_128, 113, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_cpu_for_head_dim_80)
{
    attention_check_forward(grouped_ragged_80, 114, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_cpu_with_32_heads_over_8_kv_heads)
{
    attention_check_forward(wide_128, 115, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_cpu_without_grouped_heads)
{
    attention_check_forward(ungrouped_64, 116, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_cpu_over_many_key_blocks)
{
    attention_check_forward(long_64, 117, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_cpu_with_groups_of_eight_heads)
{
    attention_check_forward(groups_of_8_128, 118, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_cpu_with_groups_of_three_heads)
{
    attention_check_forward(groups_of_3_80, 119, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, fused_backward_repeats_its_bits_at_the_llama_8b_shape)
{
    gpu_require();
    DeviceInputs d;
    Case c = attention_large_case_make(llama_8b_ragged, 501, &d);
    const char *differs = "";
    int same = attention_backward_repeats_its_bits(&c, &d, &differs);
    attention_case_free(&c);
    cr_expect(same, "%s differs between two runs (or is not finite)", differs);
}

Test(cuda_attention, fused_backward_matches_two_pass_at_the_llama_8b_shape)
{
    attention_check_backward_against(llama_8b_ragged, 511, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, specialised_forward_matches_grouped_at_the_llama_8b_shape)
{
    attention_check_forward_against(llama_8b_ragged, 531, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, specialised_forward_matches_grouped_at_the_1b_shape)
{
    attention_check_forward_against(model_1b_ragged, 541, ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, fused_backward_matches_two_pass_at_the_1b_shape)
{
    attention_check_backward_against(model_1b_ragged, 521, ATTENTION_BACKWARD_FUSED);
}

Test(cuda_attention, fused_tma_backward_matches_cpu_for_a_single_token)
{
    attention_check_backward(single_token, 601, ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_matches_cpu_with_grouped_heads_and_a_ragged_tail)
{
    attention_check_backward(grouped_ragged_64, 602, ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_matches_cpu_for_head_dim_128_past_two_query_tiles)
{
    attention_check_backward(grouped_ragged_128, 603, ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_matches_cpu_for_head_dim_80)
{
    attention_check_backward(grouped_ragged_80, 604, ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_matches_cpu_with_32_heads_over_8_kv_heads)
{
    attention_check_backward(wide_128, 605, ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_matches_cpu_over_many_key_blocks)
{
    attention_check_backward(long_64, 607, ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_matches_cpu_with_groups_of_three_heads)
{
    attention_check_backward(groups_of_3_80, 609, ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_with_accumulate_adds_to_the_gradients)
{
    attention_check_accumulate(ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_is_bitwise_deterministic)
{
    attention_check_deterministic(ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_repeats_its_bits_at_the_llama_8b_shape)
{
    gpu_require();
    DeviceInputs d;
    Case c = attention_large_case_make(llama_8b_ragged, 611, &d);
    attention_cuda_select_backward(ATTENTION_BACKWARD_FUSED_TMA);
    const char *differs = "";
    int same = attention_backward_repeats_its_bits(&c, &d, &differs);
    attention_case_free(&c);
    cr_expect(same, "%s differs between two runs (or is not finite)", differs);
}

Test(cuda_attention, fused_tma_backward_matches_two_pass_at_the_llama_8b_shape)
{
    attention_check_backward_against(llama_8b_ragged, 612, ATTENTION_BACKWARD_FUSED_TMA);
}

Test(cuda_attention, fused_tma_backward_matches_two_pass_at_the_1b_shape)
{
    attention_check_backward_against(model_1b_ragged, 613, ATTENTION_BACKWARD_FUSED_TMA);
}

/* The specialised forward with one consumer warpgroup a CTA, two CTAs a multiprocessor
 * (FATHOM_ATTENTION_FORWARD=single_consumer): no turns to take, one head a CTA. */
Test(cuda_attention, single_consumer_forward_matches_cpu_for_a_single_token)
{
    attention_check_forward(single_token, 141, ATTENTION_FORWARD_SINGLE_CONSUMER);
}

Test(cuda_attention, single_consumer_forward_matches_cpu_with_grouped_heads_and_a_ragged_tail)
{
    attention_check_forward(grouped_ragged_64, 142, ATTENTION_FORWARD_SINGLE_CONSUMER);
}

Test(cuda_attention, single_consumer_forward_matches_cpu_for_head_dim_128)
{
    attention_check_forward(grouped_ragged_128, 143, ATTENTION_FORWARD_SINGLE_CONSUMER);
}

Test(cuda_attention, single_consumer_forward_matches_cpu_for_head_dim_80)
{
    attention_check_forward(grouped_ragged_80, 144, ATTENTION_FORWARD_SINGLE_CONSUMER);
}

Test(cuda_attention, single_consumer_forward_matches_cpu_over_many_key_blocks)
{
    attention_check_forward(long_64, 147, ATTENTION_FORWARD_SINGLE_CONSUMER);
}

Test(cuda_attention, single_consumer_forward_matches_cpu_with_groups_of_three_heads)
{
    attention_check_forward(groups_of_3_80, 149, ATTENTION_FORWARD_SINGLE_CONSUMER);
}

Test(cuda_attention, single_consumer_forward_matches_grouped_at_the_1b_shape)
{
    attention_check_forward_against(model_1b_ragged, 542, ATTENTION_FORWARD_SINGLE_CONSUMER);
}

Test(cuda_attention, single_consumer_forward_matches_grouped_at_the_llama_8b_shape)
{
    attention_check_forward_against(llama_8b_ragged, 532, ATTENTION_FORWARD_SINGLE_CONSUMER);
}

/* The specialised forward persistent (FATHOM_ATTENTION_FORWARD=persistent): CTAs walk several
 * tiles, the rings' phases running on across them. At the small shapes three CTAs at most,
 * so that every CTA walks tiles of different lengths, both ways of its rounds, and stores
 * some from registers and its last through the staging; the bits must be specialised's. */
static void persistent_check_forward(Shape shape, uint64_t seed, int ctas)
{
    attention_forward_specialised_limit_ctas(ctas);
    attention_check_forward(shape, seed, ATTENTION_FORWARD_PERSISTENT);
    attention_check_forward_bits(shape, seed, ATTENTION_FORWARD_PERSISTENT,
                                 ATTENTION_FORWARD_SPECIALISED);
    attention_forward_specialised_limit_ctas(0);
}

Test(cuda_attention, persistent_forward_matches_cpu_for_a_single_token)
{
    persistent_check_forward(single_token, 151, 3);
}

Test(cuda_attention, persistent_forward_matches_cpu_and_specialised_at_head_dim_64)
{
    persistent_check_forward(grouped_ragged_64, 152, 3);
}

Test(cuda_attention, persistent_forward_matches_cpu_and_specialised_at_head_dim_128)
{
    persistent_check_forward(grouped_ragged_128, 153, 3);
}

Test(cuda_attention, persistent_forward_matches_cpu_and_specialised_at_head_dim_80)
{
    persistent_check_forward(grouped_ragged_80, 154, 2);
}

Test(cuda_attention, persistent_forward_matches_cpu_and_specialised_over_many_key_blocks)
{
    persistent_check_forward(long_64, 155, 3);
}

Test(cuda_attention, persistent_forward_matches_cpu_and_specialised_with_groups_of_three)
{
    persistent_check_forward(groups_of_3_80, 156, 3);
}

Test(cuda_attention, persistent_forward_matches_cpu_and_specialised_with_one_cta)
{
    persistent_check_forward(groups_of_8_128, 157, 1);
}

/* 16 pairs (batch, group) of 4 query tiles: with three CTAs, bands of 6, 6 and 4 pairs */
Test(cuda_attention, persistent_forward_matches_cpu_and_specialised_over_bands_of_pairs)
{
    const Shape banded = {4, 200, 8, 4, 80};
    persistent_check_forward(banded, 158, 3);
}

Test(cuda_attention, persistent_forward_repeats_specialised_bits_at_the_1b_shape_in_bands)
{
    attention_forward_specialised_limit_ctas(40); /* bands of 20, 20, 20 and 4 pairs */
    attention_check_forward_bits(model_1b_ragged, 554, ATTENTION_FORWARD_PERSISTENT,
                                 ATTENTION_FORWARD_SPECIALISED);
    attention_forward_specialised_limit_ctas(0);
}

Test(cuda_attention, persistent_forward_repeats_specialised_bits_at_the_1b_shape)
{
    attention_check_forward_bits(model_1b_ragged, 552, ATTENTION_FORWARD_PERSISTENT,
                                 ATTENTION_FORWARD_SPECIALISED);
}

Test(cuda_attention, persistent_forward_repeats_specialised_bits_at_the_llama_8b_shape)
{
    attention_check_forward_bits(llama_8b_ragged, 553, ATTENTION_FORWARD_PERSISTENT,
                                 ATTENTION_FORWARD_SPECIALISED);
}

/* head_dim 64, B2 T4000: 32 pairs of 63 query tiles, so bands of 8 rounds would split them,
 * but K, V (16.4 MB) fit in half the L2: the whole launch is one band */
Test(cuda_attention, persistent_forward_repeats_specialised_bits_where_k_v_fit_in_l2)
{
    const Shape head_dim_64 = {2, 4000, 32, 8, 64};
    attention_check_forward_bits(head_dim_64, 555, ATTENTION_FORWARD_PERSISTENT,
                                 ATTENTION_FORWARD_SPECIALISED);
}
