/* runtime/grid.h — the rank grid of DESIGN 3: world W = P x D ranks, rank = stage * D +
 * dp_rank, so a stage's data-parallel group is contiguous (one node).
 *
 * grid_create splits the world (runtime/comm.h) into the stage's data-parallel group (the D
 * ranks of one stage) and the rank's pipeline (the P ranks of one dp rank, whose rank in it
 * is the stage). Both are NULL-free: with P = 1 or D = 1 they are groups of one. The grid
 * owns the two communicators. pp * dp must equal the world size (config_load checks it
 * first, naming both keys).
 */
#ifndef FATHOM_RUNTIME_GRID_H
#define FATHOM_RUNTIME_GRID_H

#include "runtime/comm.h"

typedef struct {
    int rank, world_size;  /* in the world */
    int pp, dp;            /* P stages, D data-parallel ranks per stage */
    int stage, dp_rank;    /* rank = stage * dp + dp_rank */
    Comm *world;
    Comm *pipeline;        /* the P ranks with this dp_rank; rank in it = stage */
    Comm *data_parallel;   /* the D ranks of this stage; rank in it = dp_rank */
} RankGrid;

void grid_create(RankGrid *grid, int pp, int dp);
void grid_destroy(RankGrid *grid);

#endif
