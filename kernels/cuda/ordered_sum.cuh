/* kernels/cuda/ordered_sum.cuh — sums over many rows in a fixed order, with their loads in
 * flight together (device code, included by .cu files only). The second passes of the
 * kernels that leave a row of partial sums a block (route_block_reduce, the RMSNorm dweight
 * reduction) add each column's partials in row order, so their bits depend on nothing but the
 * partials; a thread's loads go a batch at a time, so that the sum waits on memory once a
 * batch rather than once a term (the partials were just written and sit in L2: a round trip
 * to it a batch).
 */
#ifndef FATHOM_KERNELS_CUDA_ORDERED_SUM_CUH
#define FATHOM_KERNELS_CUDA_ORDERED_SUM_CUH

/* sum_k x[k * stride], k = 0 .. count - 1, added in k order, the loads BATCH at a time. The
 * same bits whatever BATCH. The whole batches' loads are unconditional, and the short last
 * batch's past the end read the last term again: loads under the terms' own predicates were
 * issued each behind the add before it (ptxas, sm_90a; nvdisasm shows it), a round trip to
 * L2 a term. route_block_reduce with a thread's 33 terms in one short batch of 40 took 10.7
 * us a launch, where five batches of 8 had taken 4.2 (H100, 2026-12-07). */
template <int BATCH>
__device__ __forceinline__ float ordered_strided_sum(const float *x, int count, long long stride)
{
    float sum = 0.0f, terms[BATCH];
    int k = 0;
    for (; k + BATCH <= count; k += BATCH) {
        const float *batch = x + k * stride;
#pragma unroll
        for (int j = 0; j < BATCH; j++)
            terms[j] = batch[j * stride];
#pragma unroll
        for (int j = 0; j < BATCH; j++)
            sum += terms[j];
    }
    if (k < count) {
        const float *batch = x + k * stride;
        const int last = count - 1 - k;
#pragma unroll
        for (int j = 0; j < BATCH; j++)
            terms[j] = batch[(j < last ? j : last) * stride];
#pragma unroll
        for (int j = 0; j < BATCH; j++)
            if (j <= last)
                sum += terms[j];
    }
    return sum;
}

/* The terms b = first, first + step, ... below end: their count. */
__device__ __forceinline__ int strided_count(int first, int end, int step)
{
    return first < end ? (end - first + step - 1) / step : 0;
}

#endif
