/* model/rope_table.c — see rope_table.h.
 *
 * Every intermediate is a float, mirroring torch's float32 tensors. Two torch details
 * matter for bit-exactness: a python scalar meeting a float32 tensor is rounded to float32
 * first, and `scalar / tensor` is computed as `tensor.reciprocal() * scalar`.
 */
#include "model/rope_table.h"

#include <math.h>
#include <stdlib.h>

#include "runtime/error.h"

/* torch's `scalar / tensor` for one element */
static float scalar_divided_by(double scalar, float value)
{
    float reciprocal = 1.0f / value;
    return reciprocal * (float)scalar;
}

/* _compute_llama3_parameters: long wavelengths are slowed down by `factor`, short ones kept,
 * the band between the two interpolated smoothly. */
static float llama3_rescale(float inv_freq, const ModelConfig *config)
{
    const double factor = config->rope_scaling.factor;
    const double low_freq_factor = config->rope_scaling.low_freq_factor;
    const double high_freq_factor = config->rope_scaling.high_freq_factor;
    const double old_context = config->rope_scaling.original_max_position;
    const float low_freq_wavelen = (float)(old_context / low_freq_factor);
    const float high_freq_wavelen = (float)(old_context / high_freq_factor);

    float wavelen = scalar_divided_by(2.0 * M_PI, inv_freq);
    float scaled = wavelen > low_freq_wavelen ? inv_freq / (float)factor : inv_freq;
    int is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (!is_medium)
        return scaled;
    float smooth = (scalar_divided_by(old_context, wavelen) - (float)low_freq_factor) /
                   (float)(high_freq_factor - low_freq_factor);
    return (1.0f - smooth) * scaled / (float)factor + smooth * scaled;
}

void rope_inverse_frequencies(float *inv_freq, const ModelConfig *config)
{
    const int head_dim = config->head_dim;
    if (head_dim < 2 || head_dim % 2 != 0)
        fatal(EXIT_CONFIG, "model.head_dim = %d must be even for RoPE", head_dim);
    if (!(config->rope_theta > 0))
        fatal(EXIT_CONFIG, "model.rope_theta = %g must be > 0", config->rope_theta);
    if (config->rope_scaling.llama3) {
        if (!(config->rope_scaling.factor > 0))
            fatal(EXIT_CONFIG, "model.rope_scaling.factor = %g must be > 0",
                  config->rope_scaling.factor);
        if (!(config->rope_scaling.low_freq_factor > 0) ||
            !(config->rope_scaling.high_freq_factor > config->rope_scaling.low_freq_factor))
            fatal(EXIT_CONFIG, "model.rope_scaling needs 0 < low_freq_factor (%g) < "
                  "high_freq_factor (%g)", config->rope_scaling.low_freq_factor,
                  config->rope_scaling.high_freq_factor);
        if (config->rope_scaling.original_max_position < 1)
            fatal(EXIT_CONFIG, "model.rope_scaling.original_max_position = %d must be >= 1",
                  config->rope_scaling.original_max_position);
    }

    const float base = (float)config->rope_theta;
    for (int i = 0; i < head_dim / 2; i++) {
        /* torch.arange(0, dim, 2).float() / dim, then base ** that, then 1.0 / that */
        float exponent = (float)(2 * i) / (float)head_dim;
        float value = 1.0f / powf(base, exponent);
        inv_freq[i] = config->rope_scaling.llama3 ? llama3_rescale(value, config) : value;
    }
}

void rope_table_build(float *cos_table, float *sin_table, int T, const ModelConfig *config)
{
    const int half = config->head_dim / 2;
    float *inv_freq = xmalloc((size_t)(half > 0 ? half : 1) * sizeof *inv_freq);
    rope_inverse_frequencies(inv_freq, config);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            cos_table[(size_t)t * half + i] = cosf(angle);
            sin_table[(size_t)t * half + i] = sinf(angle);
        }
    }
    free(inv_freq);
}
