/* runtime/grid.c — see grid.h. */
#include "runtime/grid.h"

#include <string.h>

#include "runtime/error.h"

void grid_create(RankGrid *grid, int pp, int dp)
{
    memset(grid, 0, sizeof *grid);
    grid->world = comm_world();
    grid->rank = comm_rank(grid->world);
    grid->world_size = comm_size(grid->world);
    if ((long long)pp * dp != grid->world_size)
        fatal(EXIT_CONFIG, "parallel.pp = %d times parallel.dp = %d is %lld, but %d %s "
              "launched", pp, dp, (long long)pp * dp, grid->world_size,
              grid->world_size == 1 ? "rank was" : "ranks were");
    grid->pp = pp;
    grid->dp = dp;
    grid->stage = grid->rank / dp;
    grid->dp_rank = grid->rank % dp;
    grid->pipeline = comm_split(grid->world, grid->dp_rank, grid->stage);
    grid->data_parallel = comm_split(grid->world, grid->stage, grid->dp_rank);
    if (comm_rank(grid->pipeline) != grid->stage ||
        comm_rank(grid->data_parallel) != grid->dp_rank)
        fatal(EXIT_COMM, "rank %d: the pipeline and data-parallel groups came out in another "
              "order than rank = stage * parallel.dp + dp_rank", grid->rank);
}

void grid_destroy(RankGrid *grid)
{
    comm_free(grid->pipeline);
    comm_free(grid->data_parallel);
    memset(grid, 0, sizeof *grid);
}
