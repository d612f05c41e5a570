/* tests/test_model_replace_merge.c — where attnres's replace form makes a site's x and takes
 * its gradient (model/route_block.c, model/chunk.c, model/chunk_backward.c;
 * docs/design-notes.md, "The replace form's merge inside its sublayer's norm"): in the
 * forward every site after a block's first is merged inside its sublayer's norm
 * (route_merge_rmsnorm_forward), which also adds the sublayer before's output into the
 * partial where nothing reads it between; no site takes route_merge_forward and the norm
 * apart. In the backward every site's norm backward goes on through its merge's
 * (route_merge_rmsnorm_backward); none takes the two apart. The values are the ops' in turn
 * (the model tests hold them); this counts the ops, which the values cannot tell apart.
 */
#include "model/model.h"
#include "model/residual.h"
#include "runtime/backend.h"
#include "tests/route_support.h"
#include "tests/support.h"

#include <criterion/criterion.h>

/* The cpu backend, counting the ops that make a replace-form site's x. */
static Backend counting_backend;
static int adds, merges, merges_in_norm, merges_in_norm_with_add;

static void counting_add(Activation *out, const Activation *a, const Activation *b, size_t n)
{
    adds++;
    backend_cpu()->add(out, a, b, n);
}

static void counting_route_merge_forward(Activation *out, float *weights, float *rstd,
                                         const Activation *result, const float *lse,
                                         const Activation *partial, int n_sources,
                                         const Activation *query, const Activation *key_norm,
                                         int tokens, int d, int heads, float eps)
{
    merges++;
    backend_cpu()->route_merge_forward(out, weights, rstd, result, lse, partial, n_sources,
                                       query, key_norm, tokens, d, heads, eps);
}

static void counting_route_merge_rmsnorm_forward(Activation *x, Activation *out, float *rstd,
                                                 const RouteMerge *merge,
                                                 const Activation *weight, int rows, int d,
                                                 float eps, const GateAdd *add)
{
    merges_in_norm++;
    merges_in_norm_with_add += add != NULL;
    backend_cpu()->route_merge_rmsnorm_forward(x, out, rstd, merge, weight, rows, d, eps, add);
}

static int merge_backwards, norm_backwards, merges_in_norm_backward, with_partial;

static void counting_route_merge_backward(Activation *dpartial, GradMode dpartial_mode,
                                          float *dquery, float *dkey_norm, float *mean,
                                          const Activation *dout, const Activation *out,
                                          const Activation *partial, int n_sources,
                                          const float *weights, const float *rstd,
                                          const Activation *query, const Activation *key_norm,
                                          float *scratch, int tokens, int d, int heads)
{
    merge_backwards++;
    backend_cpu()->route_merge_backward(dpartial, dpartial_mode, dquery, dkey_norm, mean, dout,
                                        out, partial, n_sources, weights, rstd, query,
                                        key_norm, scratch, tokens, d, heads);
}

static void counting_rmsnorm_backward(Activation *dx, GradMode dx_mode, float *dweight,
                                      const Activation *dout, const Activation *x,
                                      const Activation *weight, const float *rstd, int rows,
                                      int d)
{
    norm_backwards++;
    backend_cpu()->rmsnorm_backward(dx, dx_mode, dweight, dout, x, weight, rstd, rows, d);
}

static void counting_route_merge_rmsnorm_backward(Activation *dx, float *dweight,
                                                  const Activation *dout, const Activation *x,
                                                  const Activation *weight, const float *rstd,
                                                  int rows, int d, const RouteMergeGrad *merge)
{
    merges_in_norm_backward++;
    with_partial += merge->partial != NULL;
    backend_cpu()->route_merge_rmsnorm_backward(dx, dweight, dout, x, weight, rstd, rows, d,
                                                merge);
}

/* One forward of attnres's replace form, 4 layers (8 sublayers) in blocks of 2 layers: 2
 * blocks of 4 sites; and its backward where asked. */
static void replace_run(bool checkpointing, bool backward)
{
    ResidualConfig residual = route_test_attnres(2, 2, FORM_REPLACE);
    counting_backend = *backend_cpu();
    counting_backend.add = counting_add;
    counting_backend.route_merge_forward = counting_route_merge_forward;
    counting_backend.route_merge_rmsnorm_forward = counting_route_merge_rmsnorm_forward;
    counting_backend.route_merge_backward = counting_route_merge_backward;
    counting_backend.rmsnorm_backward = counting_rmsnorm_backward;
    counting_backend.route_merge_rmsnorm_backward = counting_route_merge_rmsnorm_backward;
    Model *model = route_test_model_on(&counting_backend, 4, &residual, 73, checkpointing);
    adds = merges = merges_in_norm = merges_in_norm_with_add = 0;
    merge_backwards = norm_backwards = merges_in_norm_backward = with_partial = 0;
    route_test_forward(model);
    if (backward) {
        model_zero_grads(model);
        model_backward(model, 1.0f);
    }
    model_destroy(model);
}

/* Each block: its first site's x is phase one's Route, its other 3 are merged in their
 * norms. The first sublayer's output is the partial (no add); the second's and third's go
 * into it in the next site's norm; the last's is added at once, since the next block's phase
 * one reads the completed partial: 1 add a block. */
Test(model, replace_sites_merge_inside_their_norms_with_the_adds_before_them)
{
    replace_run(false, false);
    cr_expect_eq(merges, 0, "route_merge_forward %d times", merges);
    cr_expect_eq(merges_in_norm, 6);
    cr_expect_eq(merges_in_norm_with_add, 4);
    cr_expect_eq(adds, 2);
}

/* Under checkpointing a layer's start stays a boundary (the recompute starts there): the
 * second sublayer's output, which the next layer's first site would take, is added at once
 * (2 adds a block, 1 merge with its add). */
Test(model, replace_sites_keep_the_add_at_a_layer_start_under_checkpointing)
{
    replace_run(true, false);
    cr_expect_eq(merges, 0, "route_merge_forward %d times", merges);
    cr_expect_eq(merges_in_norm, 6);
    cr_expect_eq(merges_in_norm_with_add, 2);
    cr_expect_eq(adds, 4);
}

/* Every one of the 8 sites takes its norm's gradient through its merge in one op, the 6
 * after a block's first with the partial's share; the one norm backward apart is the final
 * norm's, before the final site, which routes alone. */
Test(model, replace_sites_take_the_norm_backward_through_the_merge)
{
    for (int checkpointing = 0; checkpointing <= 1; checkpointing++) {
        replace_run(checkpointing, true);
        cr_expect_eq(merges_in_norm_backward, 8, "checkpointing %d", checkpointing);
        cr_expect_eq(with_partial, 6, "checkpointing %d", checkpointing);
        cr_expect_eq(merge_backwards, 0, "checkpointing %d", checkpointing);
        cr_expect_eq(norm_backwards, 1, "checkpointing %d: %d", checkpointing, norm_backwards);
    }
}
