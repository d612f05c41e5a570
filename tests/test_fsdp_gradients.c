/* tests/test_fsdp_gradients.c — the "written first" gradients of runtime/fsdp.h on one rank:
 * a clear zeroes all but the written_first tensors, the first backward after it is told to
 * write them and the later ones to add, and tensors no backward wrote read as zeros. */
#include <criterion/criterion.h>

#include <stdlib.h>

#include "runtime/backend.h"
#include "runtime/fsdp.h"

/* unit 0: a norm-like tensor, a projection, another norm-like one; unit 1: a projection;
 * unit 2: nothing written first. Alignment 4 leaves padding between them. */
static const FsdpTensorSpec tensors[] = {
    {.rows = 3, .row_elements = 5, .unit = 0},
    {.rows = 4, .row_elements = 6, .unit = 0, .written_first = true},
    {.rows = 2, .row_elements = 3, .unit = 0},
    {.rows = 5, .row_elements = 2, .unit = 1, .written_first = true},
    {.rows = 1, .row_elements = 7, .unit = 2},
};
enum { TENSORS = 5, UNITS = 3 };

static Fsdp *fsdp_of_the_tensors(void)
{
    const FsdpSpec spec = {
        .backend = backend_cpu(),
        .tensors = tensors,
        .n_tensors = TENSORS,
        .n_units = UNITS,
        .alignment = 4,
    };
    return fsdp_create(&spec);
}

/* Every tensor's gradients set to `value` (the padding between them stays zero: nothing
 * writes it), without settling. */
static void grads_fill(Fsdp *fsdp, float value)
{
    float *grads = fsdp_acquire(fsdp, 0, true).grads; /* one rank: the local buffer itself */
    for (int t = 0; t < TENSORS; t++)
        for (size_t i = 0; i < tensors[t].rows * tensors[t].row_elements; i++)
            grads[fsdp_place(fsdp, t)->local_offset + i] = value;
}

static const float *tensor_grads(Fsdp *fsdp, int t)
{
    return fsdp_acquire(fsdp, 0, true).grads + fsdp_place(fsdp, t)->local_offset;
}

static void expect_tensor(Fsdp *fsdp, int t, float value, const char *when)
{
    const float *grads = tensor_grads(fsdp, t);
    for (size_t i = 0; i < tensors[t].rows * tensors[t].row_elements; i++)
        cr_assert_eq(grads[i], value, "%s: tensor %d element %zu is %g, not %g", when, t, i,
                     grads[i], value);
}

Test(fsdp_gradients, a_clear_leaves_the_written_first_tensors_to_the_next_backward)
{
    Fsdp *fsdp = fsdp_of_the_tensors();
    grads_fill(fsdp, 7.0f);
    fsdp_step_begin(fsdp, NULL);
    expect_tensor(fsdp, 0, 0.0f, "after the clear");
    expect_tensor(fsdp, 2, 0.0f, "after the clear");
    expect_tensor(fsdp, 4, 0.0f, "after the clear");
    expect_tensor(fsdp, 1, 7.0f, "after the clear (not zeroed: written next)");
    expect_tensor(fsdp, 3, 7.0f, "after the clear (not zeroed: written next)");

    cr_assert_eq(fsdp_gradient_mode(fsdp, 0), GRAD_WRITE);
    cr_assert_eq(fsdp_gradient_mode(fsdp, 0), GRAD_ADD, "a second backward adds");
    cr_assert_eq(fsdp_gradient_mode(fsdp, 2), GRAD_ADD, "nothing to write first");
    /* unit 0's projection counts as written (its backward was told to write it); unit 1's
     * was never reached and reads as zeros once the step ends */
    fsdp_step_finish(fsdp);
    expect_tensor(fsdp, 1, 7.0f, "at the step's end, written");
    expect_tensor(fsdp, 3, 0.0f, "at the step's end, never written");
    cr_assert_eq(fsdp_gradient_mode(fsdp, 1), GRAD_ADD, "settled: zeros to add into");

    fsdp_step_begin(fsdp, NULL);
    cr_assert_eq(fsdp_gradient_mode(fsdp, 1), GRAD_WRITE, "each clear hands out one write");
    fsdp_destroy(fsdp);
}

Test(fsdp_gradients, the_local_gradients_show_unwritten_tensors_as_zeros)
{
    Fsdp *fsdp = fsdp_of_the_tensors();
    grads_fill(fsdp, 3.0f);
    fsdp_step_begin(fsdp, NULL);
    const float *grads = fsdp_local_grads(fsdp); /* no backward since the clear */
    for (size_t i = 0; i < fsdp_local_count(fsdp); i++)
        cr_assert_eq(grads[i], 0.0f, "element %zu is %g", i, grads[i]);
    fsdp_destroy(fsdp);
}
