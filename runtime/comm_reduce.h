/* runtime/comm_reduce.h — the local arithmetic of comm's sums and maxima (runtime/comm.h).
 *
 * comm_reduce_blocks combines n blocks of `count` elements, laid out one after another in
 * rank order, into `out`: out[i] = op(block_0[i], block_1[i], .., block_{n-1}[i]), always
 * in that order, so the result depends only on the inputs (DESIGN 3, "Determinism").
 * Sums: float32, float64 and bfloat16 add in double and round once at the end (bfloat16:
 * to float32, then to bfloat16, nearest even); int64 adds exactly; byte cannot be summed.
 * Max: a NaN anywhere gives NaN; bytes compare unsigned. `out` may be any of the blocks'
 * memory only when it is block 0. No MPI here: comm_mpi.c gathers the blocks.
 */
#ifndef FATHOM_RUNTIME_COMM_REDUCE_H
#define FATHOM_RUNTIME_COMM_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/comm.h"

typedef enum { COMM_REDUCE_SUM, COMM_REDUCE_MAX } CommReduceOp;

void comm_reduce_blocks(const void *blocks, int n, size_t count, CommType type,
                        CommReduceOp op, void *out);

/* bfloat16 <-> float32: the top half of the float's bits; rounding to nearest even, NaN
 * kept quiet. */
float comm_bfloat16_to_float(uint16_t value);
uint16_t comm_float_to_bfloat16(float value);

#endif
