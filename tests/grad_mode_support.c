/* tests/grad_mode_support.c — see grad_mode_support.h. */
#include "tests/grad_mode_support.h"

#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cases ---- */

static GradModeArray *case_append(GradModeCase *c, const char *name, GradModeRole role,
                                  bool activation, size_t n)
{
    cr_assert_lt(c->count, GRAD_MODE_MAX_ARRAYS, "%s: too many arrays", c->op);
    GradModeArray *array = &c->arrays[c->count++];
    memset(array, 0, sizeof *array);
    array->name = name;
    array->role = role;
    array->activation = activation;
    array->n = n;
    array->scale = 1.0f;
    return array;
}

static void case_input(GradModeCase *c, const char *name, bool activation, size_t n,
                       float scale, float offset)
{
    GradModeArray *array = case_append(c, name, GRAD_MODE_INPUT, activation, n);
    array->scale = scale;
    array->offset = offset;
}

static GradModeCase case_begin(const char *op, void (*run)(const Backend *, GradMode,
                                                           void *const *, const int *))
{
    GradModeCase c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.run = run;
    return c;
}

/* dweight takes the mode too (runtime/backend.h): it is checked as the input gradient is */
static void run_matmul(const Backend *b, GradMode mode, void *const *p, const int *shape)
{
    b->matmul_backward(p[0], mode, p[1], mode, p[2], p[3], p[4], shape[0], shape[1], shape[2]);
}

GradModeCase grad_mode_case_matmul(int rows, int in_dim, int out_dim)
{
    GradModeCase c = case_begin("matmul_backward", run_matmul);
    c.shape[0] = rows, c.shape[1] = in_dim, c.shape[2] = out_dim;
    case_append(&c, "din", GRAD_MODE_INPUT_GRADIENT, true, (size_t)rows * in_dim);
    case_append(&c, "dweight", GRAD_MODE_INPUT_GRADIENT, false, (size_t)out_dim * in_dim);
    case_input(&c, "dout", true, (size_t)rows * out_dim, 1, 0);
    case_input(&c, "in", true, (size_t)rows * in_dim, 1, 0);
    case_input(&c, "weight", true, (size_t)out_dim * in_dim, 0.5f, 0);
    return c;
}

static const float rmsnorm_eps = 1e-5f;

static void run_rmsnorm(const Backend *b, GradMode mode, void *const *p, const int *shape)
{
    b->rmsnorm_backward(p[0], mode, p[1], p[2], p[3], p[4], p[5], shape[0], shape[1]);
}

static void prepare_rmsnorm(const Backend *b, void *const *p, const int *shape)
{
    b->rmsnorm_forward(p[6], p[5], p[3], p[4], shape[0], shape[1], rmsnorm_eps);
}

GradModeCase grad_mode_case_rmsnorm(int rows, int d)
{
    GradModeCase c = case_begin("rmsnorm_backward", run_rmsnorm);
    c.prepare = prepare_rmsnorm;
    c.shape[0] = rows, c.shape[1] = d;
    case_append(&c, "dx", GRAD_MODE_INPUT_GRADIENT, true, (size_t)rows * d);
    case_append(&c, "dweight", GRAD_MODE_WEIGHT_GRADIENT, false, (size_t)d);
    case_input(&c, "dout", true, (size_t)rows * d, 1, 0);
    case_input(&c, "x", true, (size_t)rows * d, 1, 0);
    case_input(&c, "weight", true, (size_t)d, 0.5f, 1);
    case_append(&c, "rstd", GRAD_MODE_PREPARED, false, (size_t)rows);
    case_append(&c, "out", GRAD_MODE_PREPARED, true, (size_t)rows * d); /* not read back */
    return c;
}

static void run_rope(const Backend *b, GradMode mode, void *const *p, const int *shape)
{
    b->rope_backward(p[0], mode, p[1], p[2], p[3], shape[0], shape[1], shape[2], shape[3]);
}

GradModeCase grad_mode_case_rope(int B, int T, int n_heads, int head_dim)
{
    GradModeCase c = case_begin("rope_backward", run_rope);
    c.shape[0] = B, c.shape[1] = T, c.shape[2] = n_heads, c.shape[3] = head_dim;
    size_t count = (size_t)B * T * n_heads * head_dim, angles = (size_t)T * head_dim / 2;
    case_append(&c, "dx", GRAD_MODE_INPUT_GRADIENT, true, count);
    case_input(&c, "dout", true, count, 1, 0);
    case_input(&c, "cos", false, angles, 1, 0);
    case_input(&c, "sin", false, angles, 1, 0);
    return c;
}

static void run_attention(const Backend *b, GradMode mode, void *const *p, const int *shape)
{
    b->attention_backward(p[0], p[1], p[2], mode, p[3], p[4], p[5], p[6], p[7], p[8], shape[0],
                          shape[1], shape[2], shape[3], shape[4]);
}

static void prepare_attention(const Backend *b, void *const *p, const int *shape)
{
    b->attention_forward(p[7], p[8], p[4], p[5], p[6], shape[0], shape[1], shape[2], shape[3],
                         shape[4]);
}

GradModeCase grad_mode_case_attention(int B, int T, int n_heads, int n_kv_heads, int head_dim)
{
    GradModeCase c = case_begin("attention_backward", run_attention);
    c.prepare = prepare_attention;
    c.shape[0] = B, c.shape[1] = T, c.shape[2] = n_heads, c.shape[3] = n_kv_heads;
    c.shape[4] = head_dim;
    size_t q_count = (size_t)B * T * n_heads * head_dim;
    size_t kv_count = (size_t)B * T * n_kv_heads * head_dim;
    case_append(&c, "dq", GRAD_MODE_INPUT_GRADIENT, true, q_count);
    case_append(&c, "dk", GRAD_MODE_INPUT_GRADIENT, true, kv_count);
    case_append(&c, "dv", GRAD_MODE_INPUT_GRADIENT, true, kv_count);
    case_input(&c, "dout", true, q_count, 1, 0);
    case_input(&c, "q", true, q_count, 1.7f, 0);
    case_input(&c, "k", true, kv_count, 1.7f, 0);
    case_input(&c, "v", true, kv_count, 1.7f, 0);
    case_append(&c, "out", GRAD_MODE_PREPARED, true, q_count);
    case_append(&c, "lse", GRAD_MODE_PREPARED, false, (size_t)B * n_heads * T);
    return c;
}

static const float cross_entropy_z_loss = 1e-2f;

static void run_cross_entropy(const Backend *b, GradMode mode, void *const *p, const int *shape)
{
    b->cross_entropy_backward(p[0], mode, p[1], p[2], p[3], p[4], shape[0], shape[1],
                              cross_entropy_z_loss);
}

/* lse from the forward; the targets (uint32, in an fp32-sized array) from a fixed pattern */
static void prepare_cross_entropy(const Backend *b, void *const *p, const int *shape)
{
    const int rows = shape[0], V = shape[1];
    uint32_t *targets = malloc((size_t)rows * sizeof *targets);
    for (int r = 0; r < rows; r++)
        targets[r] = (uint32_t)((r * 7919 + 3) % V);
    b->upload(p[4], targets, (size_t)rows * sizeof *targets);
    free(targets);
    b->cross_entropy_forward(p[5], p[3], p[2], p[4], rows, V, cross_entropy_z_loss);
}

GradModeCase grad_mode_case_cross_entropy(int rows, int V)
{
    GradModeCase c = case_begin("cross_entropy_backward", run_cross_entropy);
    c.prepare = prepare_cross_entropy;
    c.shape[0] = rows, c.shape[1] = V;
    case_append(&c, "dlogits", GRAD_MODE_INPUT_GRADIENT, true, (size_t)rows * V);
    case_input(&c, "dloss", false, (size_t)rows, 1, 0);
    case_input(&c, "logits", true, (size_t)rows * V, 4, 0);
    case_append(&c, "lse", GRAD_MODE_PREPARED, false, (size_t)rows);
    case_append(&c, "targets", GRAD_MODE_PREPARED, false, (size_t)rows);
    case_append(&c, "losses", GRAD_MODE_PREPARED, false, (size_t)rows); /* not read back */
    return c;
}

static void run_swiglu(const Backend *b, GradMode mode, void *const *p, const int *shape)
{
    b->swiglu_backward(p[0], p[1], mode, p[2], p[3], p[4], (size_t)shape[0]);
}

GradModeCase grad_mode_case_swiglu(size_t n)
{
    GradModeCase c = case_begin("swiglu_backward", run_swiglu);
    c.shape[0] = (int)n;
    case_append(&c, "dgate", GRAD_MODE_INPUT_GRADIENT, true, n);
    case_append(&c, "dup", GRAD_MODE_INPUT_GRADIENT, true, n);
    case_input(&c, "dout", true, n, 1, 0);
    case_input(&c, "gate", true, n, 3, 0);
    case_input(&c, "up", true, n, 1, 0);
    return c;
}

static const float route_eps = 1e-6f;

/* the sources, one [n_sources, tokens, d] array, as the op's pointers */
static void route_sources(const Backend *b, void *all, const int *shape,
                          const Activation **sources)
{
    for (int n = 0; n < shape[3]; n++)
        sources[n] = activation_at(b, all, (size_t)n * shape[0] * shape[1]);
}

/* the partial is the site's last source */
static void run_route_merge(const Backend *b, GradMode mode, void *const *p, const int *shape)
{
    const Activation *sources[GRAD_MODE_MAX_SOURCES];
    route_sources(b, p[6], shape, sources);
    b->route_merge_backward(p[0], mode, p[1], p[2], p[3], p[4], p[5], sources[shape[3] - 1],
                            shape[3], p[7], p[8], p[9], p[10], p[11], shape[0], shape[1],
                            shape[2]);
}

/* the site's forward over all its sources (the merge's, up to rounding): out, weights, rstd */
static void prepare_route_merge(const Backend *b, void *const *p, const int *shape)
{
    const Activation *sources[GRAD_MODE_MAX_SOURCES];
    route_sources(b, p[6], shape, sources);
    b->route_forward(p[5], p[7], p[8], sources, shape[3], p[9], p[10], NULL, NULL, shape[0],
                     shape[1], shape[2], route_eps);
}

GradModeCase grad_mode_case_route_merge(int tokens, int d, int heads, int n_sources)
{
    GradModeCase c = case_begin("route_merge_backward", run_route_merge);
    c.prepare = prepare_route_merge;
    cr_assert(n_sources >= 2 && n_sources <= GRAD_MODE_MAX_SOURCES, "%d sources", n_sources);
    c.shape[0] = tokens, c.shape[1] = d, c.shape[2] = heads, c.shape[3] = n_sources;
    const size_t row = (size_t)tokens * d;
    case_append(&c, "dpartial", GRAD_MODE_INPUT_GRADIENT, true, row);
    case_append(&c, "dquery", GRAD_MODE_WEIGHT_GRADIENT, false, (size_t)d);
    case_append(&c, "dkey_norm", GRAD_MODE_WEIGHT_GRADIENT, false, (size_t)d);
    /* written in every mode: held to the same bits as the weight gradients are */
    case_append(&c, "mean", GRAD_MODE_WEIGHT_GRADIENT, false, (size_t)tokens * heads);
    case_input(&c, "dout", true, row, 1, 0);
    case_append(&c, "out", GRAD_MODE_PREPARED, true, row);
    case_input(&c, "sources", true, (size_t)n_sources * row, 1, 0);
    case_append(&c, "weights", GRAD_MODE_PREPARED, false, (size_t)n_sources * tokens * heads);
    case_append(&c, "rstd", GRAD_MODE_PREPARED, false, (size_t)n_sources * tokens);
    case_input(&c, "query", true, (size_t)d, 0.5f, 0);
    case_input(&c, "key_norm", true, (size_t)d, 0.5f, 1);
    case_append(&c, "scratch", GRAD_MODE_PREPARED, false, (size_t)tokens * heads);
    return c;
}

/* ---- the check ---- */

static float *host_floats(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof(float));
    cr_assert_not_null(x);
    return x;
}

static void array_upload(const Backend *b, const GradModeArray *array, void *device,
                         const float *values)
{
    if (array->n == 0)
        return;
    if (array->activation)
        b->activations_upload(device, values, array->n);
    else
        b->upload(device, values, array->n * sizeof(float));
}

static float *array_download(const Backend *b, const GradModeArray *array, const void *device)
{
    float *values = host_floats(array->n);
    if (array->n == 0)
        return values;
    if (array->activation)
        b->activations_download(values, device, array->n);
    else
        b->download(values, device, array->n * sizeof(float));
    return values;
}

static bool is_gradient(const GradModeArray *array)
{
    return array->role == GRAD_MODE_INPUT_GRADIENT || array->role == GRAD_MODE_WEIGHT_GRADIENT;
}

/* Every gradient array before a run: input gradients from starts[i] (NULL: zeros), weight
 * gradients zeros. */
static void gradients_set(const Backend *b, const GradModeCase *c, void *const *device,
                          float *const *starts)
{
    for (int i = 0; i < c->count; i++) {
        const GradModeArray *array = &c->arrays[i];
        if (!is_gradient(array))
            continue;
        if (array->role == GRAD_MODE_INPUT_GRADIENT && starts && starts[i])
            array_upload(b, array, device[i], starts[i]);
        else if (array->n > 0)
            b->zero(device[i], array->n * (array->activation ? b->activation_bytes
                                                             : sizeof(float)));
    }
}

/* Asserts the same bits, naming the first element that differs (%a shows -0.0 and NaN). */
static void expect_same_bits(const GradModeCase *c, const GradModeArray *array,
                             const float *written, const float *added)
{
    if (memcmp(written, added, array->n * sizeof(float)) == 0)
        return;
    size_t i = 0;
    while (memcmp(&written[i], &added[i], sizeof(float)) == 0)
        i++;
    cr_assert_fail("%s %s[%zu]: %a after GRAD_WRITE into NaN, %a after GRAD_ADD into zeros",
                   c->op, array->name, i, written[i], added[i]);
}

static double root_mean_square(const float *x, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    return n ? sqrt(sum / (double)n) : 0;
}

void grad_mode_check(const Backend *backend, const GradModeCase *c, uint64_t seed,
                     double add_tolerance)
{
    void *device[GRAD_MODE_MAX_ARRAYS] = {0};
    float *reference[GRAD_MODE_MAX_ARRAYS] = {0}, *poison[GRAD_MODE_MAX_ARRAYS] = {0};
    float *starts[GRAD_MODE_MAX_ARRAYS] = {0};
    for (int i = 0; i < c->count; i++) {
        const GradModeArray *array = &c->arrays[i];
        size_t element = array->activation ? backend->activation_bytes : sizeof(float);
        if (array->n > 0) { /* an empty array is NULL */
            device[i] = backend->alloc(array->n * element); /* zero-filled */
            cr_assert_not_null(device[i], "%s: no memory for %s", c->op, array->name);
        }
        if (array->role == GRAD_MODE_INPUT) {
            float *values = host_floats(array->n);
            test_fill_uniform(values, array->n, array->scale, seed * 101 + (uint64_t)i);
            for (size_t j = 0; j < array->n; j++)
                values[j] += array->offset;
            array_upload(backend, array, device[i], values);
            free(values);
        }
    }
    if (c->prepare)
        c->prepare(backend, device, c->shape);

    /* 1. GRAD_ADD into zeros */
    gradients_set(backend, c, device, NULL);
    c->run(backend, GRAD_ADD, device, c->shape);
    for (int i = 0; i < c->count; i++)
        if (is_gradient(&c->arrays[i])) {
            reference[i] = array_download(backend, &c->arrays[i], device[i]);
            cr_assert(test_all_finite(reference[i], c->arrays[i].n), "%s %s is not finite",
                      c->op, c->arrays[i].name);
        }

    /* 2. GRAD_WRITE into NaN: the same bits */
    for (int i = 0; i < c->count; i++)
        if (c->arrays[i].role == GRAD_MODE_INPUT_GRADIENT) {
            poison[i] = host_floats(c->arrays[i].n);
            test_fill_nan(poison[i], c->arrays[i].n);
        }
    gradients_set(backend, c, device, poison);
    c->run(backend, GRAD_WRITE, device, c->shape);
    for (int i = 0; i < c->count; i++)
        if (is_gradient(&c->arrays[i])) {
            float *written = array_download(backend, &c->arrays[i], device[i]);
            expect_same_bits(c, &c->arrays[i], written, reference[i]);
            free(written);
        }

    /* 3. GRAD_ADD onto a start of the gradient's own size: start + reference */
    for (int i = 0; i < c->count; i++) {
        const GradModeArray *array = &c->arrays[i];
        if (array->role != GRAD_MODE_INPUT_GRADIENT)
            continue;
        double rms = root_mean_square(reference[i], array->n);
        starts[i] = host_floats(array->n);
        test_fill_uniform(starts[i], array->n, rms > 0 ? (float)(rms * sqrt(3.0)) : 1.0f,
                          seed * 101 + 50 + (uint64_t)i);
    }
    gradients_set(backend, c, device, starts);
    for (int i = 0; i < c->count; i++)
        if (starts[i]) { /* the start as the backend holds it (rounded to its dtype) */
            free(starts[i]);
            starts[i] = array_download(backend, &c->arrays[i], device[i]);
        }
    c->run(backend, GRAD_ADD, device, c->shape);
    for (int i = 0; i < c->count; i++) {
        const GradModeArray *array = &c->arrays[i];
        if (array->role != GRAD_MODE_INPUT_GRADIENT)
            continue;
        float *added = array_download(backend, array, device[i]);
        for (size_t j = 0; j < array->n; j++)
            starts[i][j] += reference[i][j]; /* now the expected sum */
        double error = test_relative_error(added, starts[i], array->n);
        cr_expect_leq(error, add_tolerance,
                      "%s %s: GRAD_ADD onto a start is %.3g (relative) from start + gradient",
                      c->op, array->name, error);
        free(added);
    }

    for (int i = 0; i < c->count; i++) {
        if (device[i])
            backend->release(device[i]);
        free(reference[i]);
        free(poison[i]);
        free(starts[i]);
    }
}
