/* tests/test_model_delta_stream.c — the delta form's backward stream gradient, which inside a
 * block carries the block's gradient (model/chunk_backward.c, stream_carry): which ops a
 * backward calls, and that the gradients follow the plain two-op form where a walk may not
 * carry (every site a block of its own).
 *
 * Inside a block of S sites, d f_{j-1} = d p_j + d b_n is the carrying stream gradient
 * itself: no add a site. The walk trades the carried gradient for the next block's at the
 * block's edge (add_difference), and for d b_0 before the embedding. With full granularity
 * every site is a block and each takes the add, as before.
 */
#include "model/model.h"
#include "model/params.h"
#include "model/residual.h"
#include "runtime/backend.h"
#include "tests/route_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>

/* The cpu backend, counting the ops that move the stream's gradient. */
static Backend counting_backend;
static int adds, adds_inplace, differences;

static void counting_add(Activation *out, const Activation *a, const Activation *b, size_t n)
{
    adds++;
    backend_cpu()->add(out, a, b, n);
}

static void counting_add_inplace(Activation *y, const Activation *x, size_t n)
{
    adds_inplace++;
    backend_cpu()->add_inplace(y, x, n);
}

static void counting_add_difference(Activation *y, const Activation *plus,
                                    const Activation *minus, size_t n)
{
    differences++;
    backend_cpu()->add_difference(y, plus, minus, n);
}

typedef struct {
    int adds, adds_inplace, differences;
} BackwardOps;

/* One forward and backward of the attnres delta form, 4 layers (8 sublayers), blocks of
 * `layers_per_block` layers (0: full granularity), counting the backward's ops. */
static BackwardOps delta_backward_ops(int layers_per_block, bool checkpointing)
{
    ResidualConfig residual = route_test_attnres(2, layers_per_block, FORM_DELTA);
    counting_backend = *backend_cpu();
    counting_backend.add = counting_add;
    counting_backend.add_inplace = counting_add_inplace;
    counting_backend.add_difference = counting_add_difference;
    Model *model = route_test_model_on(&counting_backend, 4, &residual, 71, checkpointing);
    model_zero_grads(model);
    route_test_forward(model);
    adds = adds_inplace = differences = 0;
    model_backward(model, 1.0f);
    BackwardOps ops = {adds, adds_inplace, differences};
    model_destroy(model);
    return ops;
}

/* Blocks of 2 layers: 2 blocks of 4 sites. The head's final site adds into the stream's
 * zeroed gradient and the last block's gradient joins it (2 add_inplace); the walk trades
 * block 2's for block 1's, then block 1's for d b_0 before the embedding (2 differences);
 * no site adds d p_j and d b_n. With checkpointing the only adds are the recompute's
 * p_{2i+1} = p_{2i} + f_{2i}, one a layer. */
Test(model, the_delta_stream_gradient_carries_its_block_gradient_inside_a_block)
{
    for (int checkpointing = 0; checkpointing < 2; checkpointing++) {
        BackwardOps ops = delta_backward_ops(2, checkpointing);
        cr_expect_eq(ops.adds, checkpointing ? 4 : 0, "checkpointing %d: adds %d", checkpointing,
                     ops.adds);
        cr_expect_eq(ops.adds_inplace, 2, "checkpointing %d", checkpointing);
        cr_expect_eq(ops.differences, 2, "checkpointing %d", checkpointing);
    }
}

/* Full granularity: every site is a block of its own, so each sublayer's output gradient
 * is d p_{j+1} + d b_j, an add, and nothing is carried. The head's final site (1
 * add_inplace) and the embedding's d p_0 + d b_0 (1 add_inplace) stay. */
Test(model, a_delta_site_that_is_its_own_block_adds_its_output_gradient)
{
    BackwardOps ops = delta_backward_ops(0, false);
    cr_expect_eq(ops.adds, 8);
    cr_expect_eq(ops.differences, 0);
    cr_expect_eq(ops.adds_inplace, 2);
}
