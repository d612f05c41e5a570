/* tests/cuda_backend_support.c — see cuda_backend_support.h. */
#include "tests/cuda_backend_support.h"
#include "tests/gpu_support.h"

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

OpCase op_case(const char *op, OpRunner run)
{
    OpCase c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.run = run;
    return c;
}

static OpArray *op_append(OpCase *c, const char *name, ArrayRole role, ArrayKind kind, size_t n)
{
    cr_assert_lt(c->count, OP_MAX_ARRAYS, "%s: too many arrays", c->op);
    OpArray *array = &c->arrays[c->count++];
    memset(array, 0, sizeof *array);
    array->name = name;
    array->role = role;
    array->kind = kind;
    array->n = n;
    return array;
}

void op_input(OpCase *c, const char *name, ArrayKind kind, size_t n, float scale, float offset)
{
    OpArray *array = op_append(c, name, ROLE_INPUT, kind, n);
    array->scale = scale;
    array->offset = offset;
}

void op_tokens(OpCase *c, const char *name, size_t n, int bound)
{
    op_append(c, name, ROLE_INPUT, ARRAY_TOKENS, n)->scale = (float)bound;
}

void op_output(OpCase *c, const char *name, ArrayKind kind, size_t n, double tolerance)
{
    op_append(c, name, ROLE_OUTPUT, kind, n)->tolerance = tolerance;
}

void op_accumulated(OpCase *c, const char *name, ArrayKind kind, size_t n, double tolerance)
{
    op_append(c, name, ROLE_ACCUMULATED, kind, n)->tolerance = tolerance;
}

void op_updated(OpCase *c, const char *name, size_t n, float scale, float offset,
                double tolerance)
{
    OpArray *array = op_append(c, name, ROLE_UPDATED, ARRAY_FLOAT, n);
    array->scale = scale;
    array->offset = offset;
    array->tolerance = tolerance;
}

void op_cpu_scratch(OpCase *c, const char *name, size_t n)
{
    op_append(c, name, ROLE_CPU_SCRATCH, ARRAY_FLOAT, n);
}

float *op_host(OpCase *c, int index)
{
    cr_assert_lt(index, c->count, "%s: no array %d", c->op, index);
    return (float *)c->arrays[index].host;
}

/* ---- host side ---- */

static void round_to_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = bf16_to_float(bf16_from_float(x[i]));
}

static void fill_random(float *x, size_t n, float scale, float offset, uint64_t seed)
{
    test_fill_uniform(x, n, scale, seed);
    for (size_t i = 0; i < n; i++)
        x[i] += offset;
}

static bool is_written(const OpArray *array)
{
    return array->role == ROLE_OUTPUT || array->role == ROLE_ACCUMULATED ||
           array->role == ROLE_UPDATED;
}

static void round_activation_inputs(OpCase *c)
{
    for (int i = 0; i < c->count; i++)
        if (c->arrays[i].role == ROLE_INPUT && c->arrays[i].kind == ARRAY_ACTIVATION)
            round_to_bf16(c->arrays[i].host, c->arrays[i].n);
}

/* Written arrays back to their starting state on the host. */
static void host_reset(OpCase *c)
{
    for (int i = 0; i < c->count; i++) {
        OpArray *array = &c->arrays[i];
        if (array->role == ROLE_OUTPUT)
            test_fill_nan(array->host, array->n);
        else if (array->role == ROLE_CPU_SCRATCH)
            memset(array->host, 0, array->n * sizeof(float));
        else if (array->start)
            memcpy(array->host, array->start, array->n * sizeof(float));
    }
}

static void run_on(const Backend *backend, OpCase *c, bool on_device)
{
    void *pointers[OP_MAX_ARRAYS];
    for (int i = 0; i < c->count; i++)
        pointers[i] = on_device ? c->arrays[i].device : c->arrays[i].host;
    c->run(backend, pointers, c);
}

static double root_mean_square(const float *x, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    return sqrt(sum / (double)n);
}

/* Inputs, updated starts, then accumulated starts scaled to the op's contribution. */
static void host_prepare(OpCase *c, uint64_t seed)
{
    bool accumulates = false;
    for (int i = 0; i < c->count; i++) {
        OpArray *array = &c->arrays[i];
        array->host = gpu_test_host_floats(array->n);
        uint64_t array_seed = seed * 101 + (uint64_t)i;
        if (array->kind == ARRAY_TOKENS) {
            uint32_t *tokens = array->host;
            for (size_t t = 0; t < array->n; t++)
                tokens[t] = (uint32_t)test_random_int(0, (int)array->scale - 1,
                                                      array_seed * 100003 + t);
        } else if (array->role == ROLE_INPUT || array->role == ROLE_UPDATED) {
            fill_random(array->host, array->n, array->scale, array->offset, array_seed);
        }
        accumulates |= array->role == ROLE_ACCUMULATED;
    }
    round_activation_inputs(c);
    if (c->prepare) {
        c->prepare(c);
        round_activation_inputs(c);
    }
    for (int i = 0; i < c->count; i++) {
        OpArray *array = &c->arrays[i];
        if (array->role == ROLE_UPDATED) {
            array->start = gpu_test_host_floats(array->n);
            memcpy(array->start, array->host, array->n * sizeof(float));
        }
    }
    if (!accumulates)
        return;
    host_reset(c);
    run_on(backend_cpu(), c, false); /* from zero: the contributions alone */
    for (int i = 0; i < c->count; i++) {
        OpArray *array = &c->arrays[i];
        if (array->role != ROLE_ACCUMULATED)
            continue;
        /* a contribution that is exactly zero (nothing to add) keeps a start of scale 1 */
        double rms = root_mean_square(array->host, array->n);
        array->start = gpu_test_host_floats(array->n);
        fill_random(array->start, array->n, rms > 0 ? (float)(rms * sqrt(3.0)) : 1.0f, 0.0f,
                    seed * 101 + 50 + (uint64_t)i);
        if (array->kind == ARRAY_ACTIVATION)
            round_to_bf16(array->start, array->n);
    }
}

/* ---- device side, through the cuda table ---- */

static size_t device_bytes(const OpArray *array)
{
    size_t element = array->kind == ARRAY_ACTIVATION ? backend_cuda()->activation_bytes
                                                     : sizeof(float);
    return array->n * element;
}

static void device_fill(const OpArray *array, const float *values)
{
    const Backend *cuda = backend_cuda();
    if (array->kind == ARRAY_ACTIVATION)
        cuda->activations_upload(array->device, values, array->n);
    else
        cuda->upload(array->device, values, device_bytes(array));
}

/* NaN everywhere: all-ones bytes are a NaN in bf16 and in fp32 */
static void device_poison(const OpArray *array)
{
    size_t bytes = device_bytes(array);
    unsigned char *ones = malloc(bytes);
    cr_assert_not_null(ones);
    memset(ones, 0xFF, bytes);
    backend_cuda()->upload(array->device, ones, bytes);
    free(ones);
}

static void device_reset(const OpCase *c)
{
    for (int i = 0; i < c->count; i++) {
        const OpArray *array = &c->arrays[i];
        if (array->role == ROLE_OUTPUT)
            device_poison(array);
        else if (array->role == ROLE_ACCUMULATED || array->role == ROLE_UPDATED)
            device_fill(array, array->start);
    }
}

static float *device_read(const OpArray *array)
{
    const Backend *cuda = backend_cuda();
    float *host = gpu_test_host_floats(array->n);
    if (array->kind == ARRAY_ACTIVATION)
        cuda->activations_download(host, array->device, array->n);
    else
        cuda->download(host, array->device, device_bytes(array));
    return host;
}

static void case_free(OpCase *c)
{
    for (int i = 0; i < c->count; i++) {
        OpArray *array = &c->arrays[i];
        backend_cuda()->release(array->device);
        free(array->host);
        free(array->start);
        array->host = array->device = array->start = NULL;
    }
}

void op_check(OpCase *c, uint64_t seed)
{
    const Backend *cuda = backend_cuda();
    host_prepare(c, seed);
    for (int i = 0; i < c->count; i++) {
        OpArray *array = &c->arrays[i];
        if (array->role == ROLE_CPU_SCRATCH)
            continue;
        array->device = cuda->alloc(device_bytes(array));
        if (array->role == ROLE_INPUT)
            device_fill(array, array->host);
    }
    host_reset(c);
    device_reset(c);
    run_on(backend_cpu(), c, false);
    run_on(cuda, c, true);

    float *first[OP_MAX_ARRAYS] = {NULL};
    for (int i = 0; i < c->count; i++) {
        const OpArray *array = &c->arrays[i];
        if (!is_written(array))
            continue;
        first[i] = device_read(array);
        double error = test_relative_error(first[i], array->host, array->n);
        cr_expect_leq(error, array->tolerance,
                      "%s %s (shape %d %d %d %d %d %d): relative error %.3g > %.3g", c->op,
                      array->name, c->shape[0], c->shape[1], c->shape[2], c->shape[3],
                      c->shape[4], c->shape[5], error, array->tolerance);
    }

    device_reset(c);
    run_on(cuda, c, true);
    for (int i = 0; i < c->count; i++) {
        if (!first[i])
            continue;
        float *second = device_read(&c->arrays[i]);
        cr_expect_eq(memcmp(first[i], second, c->arrays[i].n * sizeof(float)), 0,
                     "%s %s (shape %d %d %d %d %d %d): two runs differ", c->op,
                     c->arrays[i].name, c->shape[0], c->shape[1], c->shape[2], c->shape[3],
                     c->shape[4], c->shape[5]);
        free(second);
        free(first[i]);
    }
    case_free(c);
}

void split_rows(const Backend *b, void *base, int count, size_t size, Activation **out)
{
    for (int n = 0; n < count; n++)
        out[n] = activation_at(b, base, (size_t)n * size);
}

void split_rows_const(const Backend *b, const void *base, int count, size_t size,
                      const Activation **out)
{
    for (int n = 0; n < count; n++)
        out[n] = activation_at_const(b, base, (size_t)n * size);
}
