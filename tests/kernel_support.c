/* tests/kernel_support.c — see kernel_support.h. */
#include "tests/kernel_support.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support.h"

void free_all(void *first, ...)
{
    va_list rest;
    va_start(rest, first);
    for (void *pointer = first; pointer; pointer = va_arg(rest, void *))
        free(pointer);
    va_end(rest);
}

float *random_floats(size_t n, float scale, uint64_t seed)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(x);
    test_fill_uniform(x, n, scale, seed);
    return x;
}

float *zero_floats(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof(float));
    cr_assert_not_null(x);
    return x;
}

double *zero_doubles(size_t n)
{
    double *x = calloc(n ? n : 1, sizeof(double));
    cr_assert_not_null(x);
    return x;
}

float *poisoned_floats(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(x);
    test_fill_nan(x, n);
    return x;
}

double *to_doubles(const float *x, size_t n)
{
    double *y = malloc((n ? n : 1) * sizeof(double));
    cr_assert_not_null(y);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

uint32_t *random_tokens(int n, int V, uint64_t seed)
{
    uint32_t *tokens = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    cr_assert_not_null(tokens);
    for (int t = 0; t < n; t++)
        tokens[t] = (uint32_t)test_random_int(0, V - 1, seed * 1000 + (uint64_t)t);
    return tokens;
}

void point_into(const float **pointers, float *all, int count, size_t size)
{
    for (int i = 0; i < count; i++)
        pointers[i] = all + i * size;
}

void expect_close(const float *got, const double *expected, size_t n, double tolerance,
                  const char *what)
{
    double error = test_relative_error_double(got, expected, n);
    cr_assert_leq(error, tolerance, "%s: relative error %.3g", what, error);
}

void expect_doubled(const float *twice, const float *once, size_t n, const char *what)
{
    double *doubled = malloc((n ? n : 1) * sizeof(double));
    cr_assert_not_null(doubled);
    for (size_t i = 0; i < n; i++)
        doubled[i] = 2.0 * once[i];
    double error = test_relative_error_double(twice, doubled, n);
    cr_assert_leq(error, ACCUMULATION_TOLERANCE, "%s: second call did not add (error %.3g)",
                  what, error);
    free(doubled);
}

void expect_bitwise_equal(const float *a, const float *b, size_t n, const char *what)
{
    cr_assert_eq(memcmp(a, b, n * sizeof(float)), 0, "%s differs", what);
}

void expect_gradient_of_reference(ReferenceObjective objective, const void *problem,
                                  double *input, const float *gradient, size_t n, double step,
                                  double tolerance, const char *what)
{
    double *numeric = malloc((n ? n : 1) * sizeof(double));
    cr_assert_not_null(numeric);
    for (size_t i = 0; i < n; i++) {
        double saved = input[i];
        input[i] = saved + step;
        double plus = objective(problem);
        input[i] = saved - step;
        double minus = objective(problem);
        input[i] = saved;
        numeric[i] = (plus - minus) / (2 * step);
    }
    double error = test_relative_error_double(gradient, numeric, n);
    cr_assert_leq(error, tolerance, "%s: relative error %.3g against finite differences", what,
                  error);
    free(numeric);
}
