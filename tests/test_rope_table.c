/* tests/test_rope_table.c — the RoPE tables (model/rope_table.h) against Hugging Face: the
 * inverse frequencies with and without llama3 scaling, and the cos / sin tables (DESIGN 2).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "model/model.h"
#include "model/rope_table.h"
#include "runtime/error.h"

/* ---- RoPE tables ----
 * Expected values printed by Hugging Face transformers 5.24 (torch 2.15, float32):
 *   cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
 *       rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
 *           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
 *           "original_max_position_embeddings": 64})
 *   rope = LlamaRotaryEmbedding(cfg); rope.inv_freq; rope(x, position_ids)  -> cos, sin
 * and with rope_parameters={"rope_type": "default", "rope_theta": 10000.0}.
 * With original_max_position 64, head_dim 16 has wavelengths in all three llama3 bands
 * (kept: i = 0; smoothed: i = 1; divided by the factor: i >= 2). */

static ModelConfig rope_config(bool llama3)
{
    ModelConfig config = {
        .vocab_size = 11, .d_model = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .head_dim = 16, .ffn_dim = 12, .norm_eps = 1e-5, .init_std = 0.02,
    };
    config.rope_theta = llama3 ? 500000.0 : 10000.0;
    config.rope_scaling.llama3 = llama3;
    config.rope_scaling.factor = 8.0;
    config.rope_scaling.low_freq_factor = 1.0;
    config.rope_scaling.high_freq_factor = 4.0;
    config.rope_scaling.original_max_position = 64;
    return config;
}

static void check_inverse_frequencies(bool llama3, const float expected[8])
{
    ModelConfig config = rope_config(llama3);
    float inv_freq[8];
    rope_inverse_frequencies(inv_freq, &config);
    for (int i = 0; i < 8; i++) {
        /* torch's vectorised powf may differ from libm's by an ulp */
        cr_assert(fabsf(inv_freq[i] - expected[i]) <= 2e-7f * expected[i],
                  "inv_freq[%d] = %a, Hugging Face %a", i, inv_freq[i], expected[i]);
    }
}

Test(model, rope_default_inverse_frequencies_equal_hugging_face)
{
    static const float expected[8] = {0x1.000000p+0, 0x1.43d136p-2, 0x1.99999ap-4,
                                      0x1.030dc6p-5, 0x1.47ae14p-7, 0x1.9e7c70p-9,
                                      0x1.0624dep-10, 0x1.4b96c0p-12};
    check_inverse_frequencies(false, expected);
}

Test(model, rope_llama3_inverse_frequencies_equal_hugging_face)
{
    static const float expected[8] = {0x1.000000p+0, 0x1.453c18p-4, 0x1.341190p-8,
                                      0x1.ddee9ep-11, 0x1.72ba42p-13, 0x1.1f91f0p-15,
                                      0x1.be2188p-18, 0x1.5a0f4ep-20};
    check_inverse_frequencies(true, expected);
}

Test(model, rope_llama3_cos_sin_tables_equal_hugging_face)
{
    static const struct { int position; float cos[8], sin[8]; } expected[] = {
        {1, {0.540302336f, 0.996849239f, 0.999988973f, 0.999999583f, 1, 1, 1, 1},
         {0.841470957f, 0.0793196037f, 0.00470073661f, 0.000911583018f, 0.000176776681f,
          3.42810235e-05f, 6.64786967e-06f, 1.28917316e-06f}},
        {37, {0.765414059f, -0.979328632f, 0.984912634f, 0.999431252f, 0.999978602f,
              0.999999225f, 1, 1},
         {-0.643538117f, 0.202275738f, 0.173052296f, 0.0337221809f, 0.00654069055f,
          0.00126839755f, 0.000245971169f, 4.76994064e-05f}},
        {255, {-0.862303615f, 0.171728387f, 0.363576353f, 0.97310406f, 0.998984158f,
               0.999961793f, 0.999998569f, 0.99999994f},
         {-0.506391644f, 0.985144317f, 0.931564391f, 0.230365932f, 0.0450627878f,
          0.00874154922f, 0.00169520592f, 0.000328739145f}},
    };
    ModelConfig config = rope_config(true);
    const int T = 256;
    float *cos_table = xmalloc((size_t)T * 8 * sizeof(float));
    float *sin_table = xmalloc((size_t)T * 8 * sizeof(float));
    rope_table_build(cos_table, sin_table, T, &config);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(cos_table[i], 1.0f);
        cr_assert_eq(sin_table[i], 0.0f);
    }
    for (size_t e = 0; e < sizeof expected / sizeof expected[0]; e++) {
        const float *cos_row = cos_table + (size_t)expected[e].position * 8;
        const float *sin_row = sin_table + (size_t)expected[e].position * 8;
        for (int i = 0; i < 8; i++) {
            cr_assert(fabsf(cos_row[i] - expected[e].cos[i]) <= 1e-6f, "cos[%d, %d] = %.9g",
                      expected[e].position, i, cos_row[i]);
            cr_assert(fabsf(sin_row[i] - expected[e].sin[i]) <= 1e-6f, "sin[%d, %d] = %.9g",
                      expected[e].position, i, sin_row[i]);
        }
    }
    free(cos_table);
    free(sin_table);
}
