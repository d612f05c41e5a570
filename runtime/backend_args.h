/* runtime/backend_args.h — the argument structs of runtime/backend.h's ops that take more
 * than arrays and shapes: the optimizer's scalars and ranges, and what a sublayer's norm
 * forms its input from (the delta form's adds, MSAR's mix, the replace form's merge and its
 * backward). Pointers are backend memory, as every op's are (runtime/backend.h). */
#ifndef FATHOM_RUNTIME_BACKEND_ARGS_H
#define FATHOM_RUNTIME_BACKEND_ARGS_H

#include <stddef.h>

/* One element of an activation array (runtime/backend.h). */
typedef struct Activation Activation;

/* The scalars of one AdamW update (runtime/backend.h adamw_update; runtime/optim.c fills
 * them once a step and range). */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* the clipping coefficient: 1 when nothing is clipped */
    float ema_decay;  /* this update's EMA decay, read where an ema buffer is given */
    int step;         /* the update's number, counting from 1 (the bias corrections) */
} AdamwScalars;

/* One range of the flat optimizer buffers (elements from their start) with its own learning
 * rate and weight decay: runtime/backend.h adamw_update_ranges. */
typedef struct {
    size_t offset, count;
    float lr, weight_decay;
} AdamwRange;

/* What a gated norm (add_scaled_rmsnorm_forward) adds in its pass before it forms its gate:
 * the delta form's output f of the sublayer before, into the stream p, which the gate reads
 * as its base (stream must be that base: read, then written), and where partial is not NULL
 * into the open block's partial, partial = partial_before + f. add_both's or add_inplace's
 * bits, one row read fewer than either op before the norm (model/chunk.c). */
typedef struct {
    const Activation *added;
    Activation *stream;
    const Activation *partial_before;
    Activation *partial;
} GateAdd;

/* MSAR's mix of a site's m > 1 streams as the route of its gate (stream_mix_rmsnorm_forward):
 * stream_mix_forward's arguments, less out and the shapes. */
typedef struct {
    const Activation *const *streams; /* o_r [tokens, d], m of them */
    int m;
    float *gates, *rstd; /* written: [tokens, m], as stream_mix_forward saves them */
    const float *mix_bias;
    const Activation *mix_proj;
    float eps;           /* the mix's */
    Activation *scratch; /* [tokens, d]: where a backend that mixes apart puts the mix */
} StreamMix;

/* A replace-form site's merge as its sublayer's norm forms it (route_merge_rmsnorm_forward):
 * route_merge_forward's arguments, less its out and its shapes. */
typedef struct {
    float *weights, *rstd;     /* the site's [N + 1, tokens(, heads)], as the merge writes */
    const Activation *result;  /* phase one's Route over the N completed sources */
    const float *lse;          /* and its lse [tokens, heads] */
    const Activation *partial; /* the open block's partial, the site's last source */
    const Activation *query, *key_norm;
    int n_sources, heads;
    float eps; /* the Route's */
} RouteMerge;

/* A replace-form site's merge backward as its sublayer's norm backward makes its dout
 * (route_merge_rmsnorm_backward): route_merge_backward's arguments, less dout, out and the
 * shapes. */
typedef struct {
    Activation *dpartial; /* NULL where partial is */
    GradMode dpartial_mode;
    float *dquery, *dkey_norm, *mean;
    const Activation *partial; /* NULL: the site read completed sources only */
    const float *weights, *rstd;
    const Activation *query, *key_norm;
    float *scratch;
    int n_sources, heads;
} RouteMergeGrad;

#endif
