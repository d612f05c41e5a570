/* runtime/comm_reduce.c — rank-order sums and maxima of gathered blocks (comm_reduce.h). */
#include "runtime/comm_reduce.h"

#include <math.h>
#include <string.h>

#include "runtime/error.h"

size_t comm_type_size(CommType type)
{
    switch (type) {
    case COMM_FLOAT32: return 4;
    case COMM_BFLOAT16: return 2;
    case COMM_BYTE: return 1;
    case COMM_INT64: return 8;
    case COMM_FLOAT64: return 8;
    }
    fatal(EXIT_COMM, "comm: unknown CommType %d", (int)type);
}

float comm_bfloat16_to_float(uint16_t value)
{
    const uint32_t bits = (uint32_t)value << 16;
    float result;
    memcpy(&result, &bits, sizeof result);
    return result;
}

uint16_t comm_float_to_bfloat16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if (isnan(value))
        return (uint16_t)((bits >> 16) | 0x0040);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* One element of block r, as double (the sum's working precision). */
static double comm_element_as_double(const void *blocks, size_t index, CommType type)
{
    switch (type) {
    case COMM_FLOAT32: return ((const float *)blocks)[index];
    case COMM_FLOAT64: return ((const double *)blocks)[index];
    case COMM_BFLOAT16: return comm_bfloat16_to_float(((const uint16_t *)blocks)[index]);
    default: return 0.0;
    }
}

static void comm_sum_blocks(const void *blocks, int n, size_t count, CommType type, void *out)
{
    if (type == COMM_BYTE)
        fatal(EXIT_COMM, "comm: a sum over COMM_BYTE is undefined; pass the element type");
    if (type == COMM_INT64) {
        const int64_t *in = blocks;
        int64_t *result = out;
        for (size_t i = 0; i < count; i++) {
            int64_t sum = in[i];
            for (int r = 1; r < n; r++)
                sum += in[(size_t)r * count + i];
            result[i] = sum;
        }
        return;
    }
    for (size_t i = 0; i < count; i++) {
        double sum = comm_element_as_double(blocks, i, type);
        for (int r = 1; r < n; r++)
            sum += comm_element_as_double(blocks, (size_t)r * count + i, type);
        if (type == COMM_FLOAT32)
            ((float *)out)[i] = (float)sum;
        else if (type == COMM_FLOAT64)
            ((double *)out)[i] = sum;
        else
            ((uint16_t *)out)[i] = comm_float_to_bfloat16((float)sum);
    }
}

/* The larger of a running maximum and a new value; NaN, once in, stays. */
static int comm_replaces_max(double current, double candidate)
{
    return !isnan(current) && (isnan(candidate) || candidate > current);
}

static void comm_max_blocks(const void *blocks, int n, size_t count, CommType type, void *out)
{
    const size_t element = comm_type_size(type);
    for (size_t i = 0; i < count; i++) {
        size_t best = i; /* index of the winning element inside `blocks` */
        for (int r = 1; r < n; r++) {
            const size_t candidate = (size_t)r * count + i;
            int replaces;
            if (type == COMM_INT64)
                replaces = ((const int64_t *)blocks)[candidate] > ((const int64_t *)blocks)[best];
            else if (type == COMM_BYTE)
                replaces = ((const uint8_t *)blocks)[candidate] > ((const uint8_t *)blocks)[best];
            else
                replaces = comm_replaces_max(comm_element_as_double(blocks, best, type),
                                             comm_element_as_double(blocks, candidate, type));
            if (replaces)
                best = candidate;
        }
        /* memmove: out may be block 0, and best may be i itself */
        memmove((char *)out + i * element, (const char *)blocks + best * element, element);
    }
}

void comm_reduce_blocks(const void *blocks, int n, size_t count, CommType type,
                        CommReduceOp op, void *out)
{
    if (op == COMM_REDUCE_SUM)
        comm_sum_blocks(blocks, n, count, type, out);
    else
        comm_max_blocks(blocks, n, count, type, out);
}
