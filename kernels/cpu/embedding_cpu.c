/* kernels/cpu/embedding_cpu.c — token embedding lookup and its gradient (DESIGN 2: e = embed[x]).
 *
 * table [V, d], out / dout [n, d], tokens [n]. The backward scatters rows of dout into the
 * rows of dtable that the tokens name; a token that repeats sends several rows to the same
 * place, so the work is split over columns of d, never over tokens: each column is summed by
 * one thread in token order, which keeps the result independent of the thread count.
 */
#include "kernels/cpu/kernels_cpu.h"

#include <string.h>

/* Columns of d given to one thread at a time in the backward: a cache line's worth of
 * several rows, enough to keep the loop over tokens cheap. */
enum { EMBEDDING_COLUMN_BLOCK = 64 };

void cpu_embedding_forward(float *out, const uint32_t *tokens, const float *table, int n, int d)
{
#pragma omp parallel for schedule(static) if ((size_t)n * d >= CPU_PARALLEL_MIN_WORK)
    for (int t = 0; t < n; t++)
        memcpy(out + (size_t)t * d, table + (size_t)tokens[t] * d, (size_t)d * sizeof(float));
}

void cpu_embedding_backward(float *dtable, const float *dout, const uint32_t *tokens, int n,
                            int d)
{
    int n_blocks = (d + EMBEDDING_COLUMN_BLOCK - 1) / EMBEDDING_COLUMN_BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)n * d >= CPU_PARALLEL_MIN_WORK)
    for (int block = 0; block < n_blocks; block++) {
        int first = block * EMBEDDING_COLUMN_BLOCK;
        int last = first + EMBEDDING_COLUMN_BLOCK < d ? first + EMBEDDING_COLUMN_BLOCK : d;
        for (int t = 0; t < n; t++) {
            float *row = dtable + (size_t)tokens[t] * d;
            const float *grad = dout + (size_t)t * d;
            for (int c = first; c < last; c++)
                row[c] += grad[c];
        }
    }
}

void cpu_sum_rows(float *out, const float *x, int rows, int d)
{
    int n_blocks = (d + EMBEDDING_COLUMN_BLOCK - 1) / EMBEDDING_COLUMN_BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)rows * d >= CPU_PARALLEL_MIN_WORK)
    for (int block = 0; block < n_blocks; block++) {
        int first = block * EMBEDDING_COLUMN_BLOCK;
        int last = first + EMBEDDING_COLUMN_BLOCK < d ? first + EMBEDDING_COLUMN_BLOCK : d;
        for (int t = 0; t < rows; t++) {
            const float *row = x + (size_t)t * d;
            for (int c = first; c < last; c++)
                out[c] += row[c];
        }
    }
}
