/* kernels/cuda/route_merge_narrow.cuh — the replace form's merge of one token, and its
 * backward, in the warp-a-token layout (route_narrow.cuh: lane l owns channels [l d/32,
 * (l+1) d/32), LV = d / 256 vectors of 8, a head whole lanes), for the kernels that merge a
 * partial they read (route_merge_narrow_cuda.cu) and those that convolve it
 * (route_merge_conv_cuda.cu): one copy of the math of route_merge_cuda.cu's header, so that
 * they give the same bits. CUDA C++ only.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_MERGE_NARROW_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_MERGE_NARROW_CUH

#include "kernels/cuda/route_block_device.cuh"
#include "kernels/cuda/route_device.cuh"
#include "kernels/cuda/route_merge.cuh"
#include "kernels/cuda/route_narrow_device.cuh"

enum { MERGE_NARROW_HELD = 4 }; /* phase-one weights a lane loads with its token (N H <= 128) */

/* rows 0..N-1 of token t's weights [N + 1, tokens, H], entries lane + 32 k (0 past N H):
 * loaded with the token's rows, rescaled by merge_narrow_token */
__device__ __forceinline__ void merge_narrow_held_load(float (&held)[MERGE_NARROW_HELD],
                                                       const float *weights, int N, int H,
                                                       int tokens, long long t, int lane)
{
#pragma unroll
    for (int k = 0; k < MERGE_NARROW_HELD; k++) {
        const int i = lane + 32 * k;
        held[k] = i < N * H ? weights[((long long)(i / H) * tokens + t) * H + i % H] : 0.0f;
    }
}

/* The start of token t's merge in the warp-a-token forward kernels: the row `partial` (the
 * partial, or the one before the add that makes it) and phase one's result come into the
 * warp's stages, and `extra` (NULL: none) into extra_stage, while the token's lse and held
 * weights load. Returns with every copy landed and the warp in step, this lane's vectors of
 * the partial's row and the result's in p_raw and result_raw, the first in fp32 in p. */
template <int LV>
__device__ __forceinline__ void merge_narrow_fetch(const MergeArgs &args, long long t, int lane,
                                                   const bf16 *partial, BfVector<8> *partial_stage,
                                                   const bf16 *extra, BfVector<8> *extra_stage,
                                                   BfVector<8> *result_stage, float *completed,
                                                   float (&held)[MERGE_NARROW_HELD],
                                                   BfVector<8> (&p_raw)[LV],
                                                   BfVector<8> (&result_raw)[LV],
                                                   float (&p)[8 * LV])
{
    narrow_copy_row<LV>(partial_stage, partial, t, lane);
    if (extra)
        narrow_copy_row<LV>(extra_stage, extra, t, lane);
    narrow_copy_row<LV>(result_stage, args.result, t, lane);
    copy_async_commit();
    *completed = args.lse[t * args.heads + lane / (32 / args.heads)];
    merge_narrow_held_load(held, args.weights, args.n_completed, args.heads, args.tokens, t,
                           lane);
    copy_async_wait<0>();
    __syncwarp();
    narrow_lane_vectors<LV>(p_raw, partial_stage, lane);
    narrow_lane_vectors<LV>(result_raw, result_stage, lane);
#pragma unroll
    for (int j = 0; j < LV; j++)
        vector_to_floats<8>(p_raw[j], p + 8 * j);
}

/* Token t's merge, p (this lane's channels of the partial, fp32) given (out_raw: this lane's
 * vectors of out, for the caller to store):
 *   r = rsqrt(mean(p^2) + eps), z = r < q*g, p > per head, w_c = e^(lse - l), w_p =
 *   e^(z - l) with l = log(e^lse + e^z) about max(lse, z);
 *   out = w_c result + w_p p; weights rows 0..N-1 = held * w_c (and past the held ones *=),
 *   row N = w_p; rstd row N = r. */
template <int LV>
__device__ __forceinline__ void merge_narrow_token(BfVector<8> (&out_raw)[LV], float *weights,
                                                   float *rstd,
                                                   const BfVector<8> (&result_raw)[LV],
                                                   float completed,
                                                   const float (&held)[MERGE_NARROW_HELD],
                                                   const float *p, const float *key_weight,
                                                   int N, int H, int tokens, long long t,
                                                   float inverse_width, float eps, int lane)
{
    const int lanes_per_head = 32 / H, head = lane / lanes_per_head;
    float squares = 0.0f, dot = 0.0f;
#pragma unroll
    for (int c = 0; c < 8 * LV; c++) {
        squares += p[c] * p[c];
        dot += key_weight[c] * p[c];
    }
    squares = warp_sum(squares);
    dot = head_sum(dot, lanes_per_head);
    const float r = rsqrtf(squares * inverse_width + eps), z = r * dot;
    const float top = fmaxf(completed, z);
    const float total = top + __logf(__expf(completed - top) + __expf(z - top));
    const float w_c = __expf(completed - total), w_p = __expf(z - total);
#pragma unroll
    for (int j = 0; j < LV; j++) {
        float result[8], merged[8];
        vector_to_floats<8>(result_raw[j], result);
#pragma unroll
        for (int i = 0; i < 8; i++)
            merged[i] = w_c * result[i] + w_p * p[8 * j + i];
        out_raw[j] = vector_from_floats<8>(merged);
    }
    if (lane % lanes_per_head == 0)
        weights[((long long)N * tokens + t) * H + head] = w_p;
    if (lane == 0)
        rstd[(long long)N * tokens + t] = r;
    /* entry i's head is i % H; with 32 % H == 0 that is lane % H for every k, so one shuffle
     * gives each lane the w_c of all its entries */
    const float scale = __shfl_sync(0xffffffffu, w_c, (lane % H) * lanes_per_head);
#pragma unroll
    for (int k = 0; k < MERGE_NARROW_HELD; k++) {
        const int i = lane + 32 * k;
        if (i < N * H)
            weights[((long long)(i / H) * tokens + t) * H + i % H] = held[k] * scale;
    }
    for (int i = lane + 32 * MERGE_NARROW_HELD; i < N * H; i += 32) /* past the held ones */
        weights[((long long)(i / H) * tokens + t) * H + i % H] *= scale;
}

/* The start of token t's merge backward in the warp-a-token kernels: the row `dy` (d out, or
 * the row the caller makes it from), the merged out and, with a partial, the partial and d
 * partial's old value (when it adds) are copied into the warp's rows `stage`, four rows
 * NarrowRow<LV>::VECTORS apart in that order, while the partial's weight and rstd load into
 * *a and *r (0 without a partial). The copies are committed, not awaited: the caller issues
 * its own loads, then waits (copy_async_wait<0>, __syncwarp). */
template <int LV>
__device__ __forceinline__ void merge_narrow_backward_fetch(const MergeArgs &args, long long t,
                                                            int lane, const bf16 *dy,
                                                            BfVector<8> *stage, float *a,
                                                            float *r)
{
    constexpr int VECTORS = NarrowRow<LV>::VECTORS;
    const int head = lane / (32 / args.heads), N = args.n_completed;
    narrow_copy_row<LV>(stage, dy, t, lane);
    narrow_copy_row<LV>(stage + VECTORS, args.merged, t, lane);
    if (args.partial) {
        narrow_copy_row<LV>(stage + 2 * VECTORS, args.partial, t, lane);
        if (args.dpartial_add)
            narrow_copy_row<LV>(stage + 3 * VECTORS, args.dpartial, t, lane);
    }
    copy_async_commit();
    *a = args.partial ? args.weights[((long long)N * args.tokens + t) * args.heads + head] : 0.0f;
    *r = args.partial ? args.rstd[(long long)N * args.tokens + t] : 0.0f;
}

/* A token's rows as merge_narrow_backward_token takes them: this lane's LV vectors of d out
 * (dy), the merged out (x), the partial (p) and d partial's old value (old, read when it
 * `adds`), and where this lane's vectors of the new d partial go (grad). Each points either
 * at an array of LV vectors in registers or at the lane's vectors of a warp's row in shared
 * memory (row + lane * NarrowRow<LV>::STRIDE): a kernel short of registers leaves its rows
 * there, and the math reads them a vector at a time, where it needs them. */
struct MergeTokenRows {
    const BfVector<8> *dy, *x, *p, *old;
    BfVector<8> *grad;
};

/* Token t's merge backward (dy = d out, x = the merged out, p = the partial, old = d
 * partial's old value when `adds`):
 *   mean = < dy, x > per head, written;
 * and with a partial (a = its weight, r = its rstd):
 *   D = < dy, p >, P = < q*g, p > per head, dz = a (D - mean), e = r^2 (r sum_h dz P) / d,
 *   d partial = old (adds) or +0.0 (GRAD_WRITE) + a dy + r dz q*g - e p, into rows.grad
 *   (this lane's vectors, for the caller to store); a grad vector is written after the
 *   vectors j of dy, p and old are read, so grad may be dy's row;
 *   channel_sums += r dz p per channel. */
template <int LV>
__device__ __forceinline__ void merge_narrow_backward_token(
    const MergeTokenRows &rows, float *mean_out, bool has_partial, bool adds, float a, float r,
    const float *key_weight, float *channel_sums, int H, long long t, float inverse_width,
    int lane)
{
    const int lanes_per_head = 32 / H, head = lane / lanes_per_head;
    float centre = 0.0f, value = 0.0f, key = 0.0f;
#pragma unroll
    for (int j = 0; j < LV; j++) {
        float dy[8], x[8], p[8];
        vector_to_floats<8>(rows.dy[j], dy);
        vector_to_floats<8>(rows.x[j], x);
#pragma unroll
        for (int i = 0; i < 8; i++)
            centre += dy[i] * x[i];
        if (has_partial) {
            vector_to_floats<8>(rows.p[j], p);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                value += dy[i] * p[i];
                key += key_weight[8 * j + i] * p[i];
            }
        }
    }
    const float mean = head_sum(centre, lanes_per_head);
    if (lane % lanes_per_head == 0)
        mean_out[t * H + head] = mean;
    if (!has_partial)
        return;
    const float dz = a * (head_sum(value, lanes_per_head) - mean);
    const float key_sum = head_sum(key, lanes_per_head);
    const float self = warp_sum(lane % lanes_per_head == 0 ? dz * key_sum : 0.0f);
    const float self_term = r * r * (r * self * inverse_width);
    const float key_coefficient = r * dz;
#pragma unroll
    for (int j = 0; j < LV; j++) { /* the rows converted again: registers, not loads */
        float dy[8], p[8], grad[8] = {}; /* GRAD_WRITE: +0.0, an add into zeros */
        vector_to_floats<8>(rows.dy[j], dy);
        vector_to_floats<8>(rows.p[j], p);
        if (adds)
            vector_to_floats<8>(rows.old[j], grad);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int c = 8 * j + i;
            grad[i] += a * dy[i] + key_coefficient * key_weight[c] - self_term * p[i];
            channel_sums[c] += key_coefficient * p[i];
        }
        rows.grad[j] = vector_from_floats<8>(grad);
    }
}

#endif
