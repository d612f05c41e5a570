/* tests/kernel_support.h — helpers shared by the tests of the cpu kernels (DESIGN 7, "Unit").
 *
 * Buffers: every allocation here asserts success and holds at least one element, so a
 * zero-sized case still gets a pointer free() accepts; the caller frees what it gets.
 * Random values come from tests/support.h's fixed-seed generator. The expect_* functions
 * assert through Criterion; `what` names the tensor in the failure message.
 */
#ifndef FATHOM_TESTS_KERNEL_SUPPORT_H
#define FATHOM_TESTS_KERNEL_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

/* A second backward call adds the same values again: the sum differs from 2x only by
 * rounding. */
#define ACCUMULATION_TOLERANCE 1e-6

/* Frees every pointer of the list, which ends with NULL. */
void free_all(void *first, ...);

/* [n] uniform in [-scale, scale) from `seed`. */
float *random_floats(size_t n, float scale, uint64_t seed);
float *zero_floats(size_t n);
double *zero_doubles(size_t n);
/* [n] NaN: an element the kernel never writes fails the comparison. */
float *poisoned_floats(size_t n);
double *to_doubles(const float *x, size_t n);
/* [n] token ids in [0, V). */
uint32_t *random_tokens(int n, int V, uint64_t seed);
/* pointers[i] = all + i * size for i < count: one buffer seen as `count` tensors. */
void point_into(const float **pointers, float *all, int count, size_t size);

/* Relative error ||got - expected|| / ||expected|| <= tolerance. */
void expect_close(const float *got, const double *expected, size_t n, double tolerance,
                  const char *what);
/* twice == 2 * once within ACCUMULATION_TOLERANCE: the second call added, not overwrote. */
void expect_doubled(const float *twice, const float *once, size_t n, const char *what);
void expect_bitwise_equal(const float *a, const float *b, size_t n, const char *what);

/* A scalar objective L evaluated in double on a double reference of the op. */
typedef double (*ReferenceObjective)(const void *problem);

/* Asserts that `gradient` [n] is dL/d input within `tolerance` (relative error), by central
 * differences with `step` over every element of `input` (restored afterwards). */
void expect_gradient_of_reference(ReferenceObjective objective, const void *problem,
                                  double *input, const float *gradient, size_t n, double step,
                                  double tolerance, const char *what);

#endif
