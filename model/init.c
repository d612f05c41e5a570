/* model/init.c — see init.h. */
#include "model/init.h"

#include "runtime/error.h"
#include "runtime/rng.h"

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
    case PARAM_ROUTING:
        /* Biases and the routing queries, gates and null source start at 0 (DESIGN 2.1); the
         * routing weights with other starting values (key norms, MSAR mix biases) are not
         * in the table yet and will need their own rule here. */
        for (size_t i = 0; i < n; i++)
            values[i] = 0.0f;
        return;
    }
}

void init_fill_param(float *values, const ParamEntry *entry, uint64_t seed, double init_std)
{
    init_fill_param_range(values, entry, 0, entry->count, seed, init_std);
}
