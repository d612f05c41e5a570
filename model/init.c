/* model/init.c — see init.h. */
#include "model/init.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/rng.h"

/* True when `name` ends with `suffix`. */
static bool name_ends_with(const char *name, const char *suffix)
{
    size_t length = strlen(name), suffix_length = strlen(suffix);
    return length >= suffix_length && strcmp(name + length - suffix_length, suffix) == 0;
}

/* The routing weights start where the routed model is the plainest one of its family
 * (docs/design-notes.md, "Attention over depth"): query 0 (uniform depth weights), key_norm
 * 1, alpha 0 (the delta form is the base model), null 0, each stream convolution the
 * identity (tap 0 = 1, other taps 0), mix_bias -ln(m-1) and mix_proj 0 (every mix gate
 * 1/m). */
static void init_fill_routing(float *values, const ParamEntry *entry, size_t first, size_t n)
{
    float constant = 0.0f;
    if (name_ends_with(entry->name, ".key_norm")) {
        constant = 1.0f;
    } else if (name_ends_with(entry->name, ".mix_bias")) {
        const int m = entry->shape[0]; /* [m], present only for m > 1 */
        constant = (float)-log((double)(m - 1));
    } else if (name_ends_with(entry->name, ".conv")) {
        /* [m, k_max, d]: element (r, tau, c) is tap tau of channel c */
        const size_t k_max = (size_t)entry->shape[1], d = (size_t)entry->shape[2];
        for (size_t i = 0; i < n; i++)
            values[i] = (first + i) / d % k_max == 0 ? 1.0f : 0.0f;
        return;
    }
    for (size_t i = 0; i < n; i++)
        values[i] = constant;
}

void init_fill_param_range(float *values, const ParamEntry *entry, size_t first, size_t n,
                           uint64_t seed, double init_std)
{
    if (first + n > entry->count)
        fatal(EXIT_CONFIG, "initialising elements %zu..%zu of '%s', which has %zu", first,
              first + n, entry->name, entry->count);
    switch (entry->kind) {
    case PARAM_NORM:
        for (size_t i = 0; i < n; i++)
            values[i] = 1.0f;
        return;
    case PARAM_EMBEDDING:
    case PARAM_MATRIX:
        rng_fill_normal(values, n, first, 0.0, init_std, seed, rng_stream_of_name(entry->name));
        return;
    case PARAM_BIAS:
        for (size_t i = 0; i < n; i++)
            values[i] = 0.0f;
        return;
    case PARAM_ROUTING:
        init_fill_routing(values, entry, first, n);
        return;
    }
}

void init_fill_param(float *values, const ParamEntry *entry, uint64_t seed, double init_std)
{
    init_fill_param_range(values, entry, 0, entry->count, seed, init_std);
}
