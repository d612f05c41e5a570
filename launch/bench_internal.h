/* launch/bench_internal.h — what the files of `fathom bench` share (launch/bench.h says
 * what the command does): the shapes, the result table, timing between backend events, and
 * random inputs in backend memory. Nothing outside launch/bench*.c includes this.
 */
#ifndef FATHOM_LAUNCH_BENCH_INTERNAL_H
#define FATHOM_LAUNCH_BENCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/backend.h"
#include "runtime/config.h"

enum { BENCH_MAX_ROWS = 32, BENCH_STREAMS = 4, BENCH_KERNEL_MAX = 8 };

/* The shapes of every case: the real ones, or --small. */

/* MSAR's streams in every case: kernel sizes 1, 2, 4, 8 (bench.c) */
extern const int bench_kernels[BENCH_STREAMS];

/* One shape of the step cases (bench_step.c): `name` is the case. */
typedef struct {
    const char *name;
    ModelConfig model;
    int microbatch, microbatches, T, layers_per_block;
} BenchStepShape;

enum { BENCH_STEP_1B, BENCH_STEP_WIDE, BENCH_STEP_GRAFT, BENCH_STEP_SHAPES };

typedef struct {
    ModelConfig layers_model;
    int layers_T;
    int attention_B, attention_T, attention_heads, attention_kv_heads, attention_head_dim;
    int route_d, route_heads, route_tokens, route_sublayers, route_blocks;
    int step_route_sublayers, step_route_blocks; /* the routing of the step's MHAR */
    BenchStepShape steps[BENCH_STEP_SHAPES];   /* step (1B), step8b, graft */
} BenchShapes;

typedef struct {
    char case_name[16], mode[24];
    double ms, rate, peak_gib;
    const char *unit; /* "TFLOP/s", "GB/s", "tok/s" */
} BenchRow;

typedef struct {
    const Backend *backend;
    BenchShapes shapes;
    int repeat;
    BenchRow rows[BENCH_MAX_ROWS];
    int n_rows;
    FILE *json;
    bool quiet; /* a rank other than 0 under mpirun: keeps its rows, prints nothing */
} Bench;

typedef void (*BenchWork)(void *context);

/* Median of `repeat` runs of work(context) after two warm-ups, in milliseconds between
 * events on the backend's stream. */
double bench_time_ms(const Backend *backend, BenchWork work, void *context, int repeat);
/* The most backend memory held since the last memory_peak_reset, in GiB (NaN: not counted). */
double bench_peak_gib(const Backend *backend);
/* One result: printed at once, written to --json, kept for the table. */
void bench_add(Bench *bench, const char *case_name, const char *mode, double ms, double rate,
               const char *unit, double peak);

/* Backend arrays of n activations: uniform in [-scale, scale) from a fixed sequence, or zero. */
Activation *bench_random_activations(const Backend *backend, size_t n, float scale);
Activation *bench_zero_activations(const Backend *backend, size_t n);
void bench_random_tokens(uint32_t *tokens, size_t n, int vocab);

/* bench_route.c, a site at a time: msar, the MSAR sites of the 8B graft; step_routing, the
 * Block MHAR routing of one microbatch of the 1B step (route-1b-sites); else the Block MHAR
 * delta sites of the graft (route-sites). */
void bench_case_route(Bench *bench, bool msar, bool step_routing);
/* bench_route_block.c, two-phase as the model routes attnres: the 8B graft's delta sites
 * (route), or the 1B step's replace-form routing (route-1b). */
void bench_case_route_blocks(Bench *bench, bool step_routing);
/* bench_step.c: one training step of BenchShapes.steps[shape] (BENCH_STEP_*) for one
 * residual mode (standard, mhar, msar, mhar-delta, msar-delta). bench_step_case runs `name`
 * when it is a step case: a shape's name runs its modes, NAME-MODE that one mode; false when
 * `name` is no step case. */
void bench_case_step(Bench *bench, int shape, const char *mode);
/* bench_comm.c, under mpirun: FSDP's grouped all-gather and reduce-scatter of a 1B layer,
 * an 8B layer and the 8B embedding over the world; bus GB/s. */
void bench_case_comm(Bench *bench);
bool bench_step_case(Bench *bench, const char *name);

#endif
