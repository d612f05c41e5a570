/* tests/test_rng.c — runtime/rng: the normal fill is its per-element definition, bit for
 * bit, on any number of threads and over any slice (model/init.h relies on it). */
#include <criterion/criterion.h>

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/rng.h"

/* The definition of rng.h, written out from the uniforms: Box-Muller in double with libm. */
static float definition(uint64_t seed, uint64_t stream, uint64_t index, double mean,
                        double std)
{
    uint64_t pair = index / 2;
    double u1 = rng_uniform(seed, stream, 2 * pair);
    double u2 = rng_uniform(seed, stream, 2 * pair + 1);
    double radius = sqrt(-2.0 * log(1.0 - u1));
    double angle = 2.0 * M_PI * u2;
    double normal = index % 2 == 0 ? radius * cos(angle) : radius * sin(angle);
    return (float)(mean + std * normal);
}

static size_t count_differences(const float *a, const float *b, size_t n)
{
    size_t differing = 0;
    for (size_t i = 0; i < n; i++)
        differing += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return differing;
}

Test(rng, fill_normal_is_box_muller_of_the_uniforms_bit_for_bit)
{
    /* an odd first element (the second half of a pair), a mean that is not 0, and enough
     * elements for every quadrant of the angle many times over */
    static const struct { uint64_t seed, first; double mean, std; } cases[] = {
        {1234, 3, 0.0, 0.02}, {7, 1000001, 0.25, 1.0}, {99, 0, -3.0, 1e-3},
    };
    const size_t n = 1 << 19;
    float *filled = malloc(n * sizeof(float)), *expected = malloc(n * sizeof(float));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t stream = rng_stream_of_name("model.layers.0.mlp.up_proj.weight");
        rng_fill_normal(filled, n, cases[c].first, cases[c].mean, cases[c].std,
                        cases[c].seed, stream);
        for (size_t i = 0; i < n; i++)
            expected[i] = definition(cases[c].seed, stream, cases[c].first + i,
                                     cases[c].mean, cases[c].std);
        cr_assert_eq(count_differences(filled, expected, n), 0,
                     "case %zu: %zu of %zu elements differ from the definition", c,
                     count_differences(filled, expected, n), n);
    }
    free(filled);
    free(expected);
}

Test(rng, rng_normal_is_the_definition_element_by_element)
{
    for (uint64_t index = 0; index < 4096; index++)
        cr_assert_eq((float)rng_normal(5, 11, index), definition(5, 11, index, 0.0, 1.0),
                     "element %llu", (unsigned long long)index);
}

Test(rng, fill_normal_gives_the_same_bits_on_one_two_and_three_threads)
{
    const size_t n = 300001; /* odd, and above the threshold where threads start */
    float *one = malloc(n * sizeof(float)), *more = malloc(n * sizeof(float));
    int threads_before = omp_get_max_threads();
    omp_set_num_threads(1);
    rng_fill_normal(one, n, 1, 0.0, 0.02, 42, 77);
    for (int threads = 2; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        rng_fill_normal(more, n, 1, 0.0, 0.02, 42, 77);
        cr_assert_eq(count_differences(one, more, n), 0, "%d threads", threads);
    }
    omp_set_num_threads(threads_before);
    free(one);
    free(more);
}

Test(rng, a_fill_of_a_slice_equals_that_slice_of_the_whole_fill)
{
    const size_t n = 200000;
    float *whole = malloc(n * sizeof(float)), *slice = malloc(n * sizeof(float));
    rng_fill_normal(whole, n, 0, 0.0, 1.0, 3, 9);
    /* slices that start and end inside a Box-Muller pair, one of a single element */
    static const size_t slices[][2] = {{1, 100001}, {99999, 1}, {70000, 129999}, {0, 3}};
    for (size_t s = 0; s < sizeof slices / sizeof slices[0]; s++) {
        size_t first = slices[s][0], count = slices[s][1];
        rng_fill_normal(slice, count, first, 0.0, 1.0, 3, 9);
        cr_assert_eq(memcmp(slice, whole + first, count * sizeof(float)), 0,
                     "elements %zu..%zu", first, first + count);
    }
    free(whole);
    free(slice);
}
