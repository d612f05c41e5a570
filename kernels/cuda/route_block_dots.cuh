/* kernels/cuda/route_block_dots.cuh — the softmax backward of one head's dots in the warp
 * that made them (CUDA C++ only; the contract is route_block_cuda.h's): shared by the
 * dots kernel that writes the coefficients for the walker (route_block_dots_cuda.cu) and
 * the one-pass backward that uses them where they are made (route_block_one_pass_cuda.cu),
 * so that both make the same coefficients bit for bit.
 */
#ifndef FATHOM_KERNELS_CUDA_ROUTE_BLOCK_DOTS_CUH
#define FATHOM_KERNELS_CUDA_ROUTE_BLOCK_DOTS_CUH

#include "kernels/cuda/route_block_device.cuh"

/* ---- the coefficients inside the dots, where a warp is a whole head ----
 * Where each warp's products cover one whole head (block_dots_fused), the warp holds every
 * D and P of that head for the token, and the softmax backward of its (site, head) pairs
 * needs nothing else: the warp makes the token's coefficients itself (the math of the
 * coefficients kernel of route_block_dots_cuda.cu, with the sums over sources and sites
 * taken by shuffles in a fixed tree), so the parts' round trip through memory and the
 * coefficients kernel go: the
 * dots and coefficients of a 1B MHAR delta step 5.76 -> 5.02 ms (H100, 2026-12-07).
 * Only e_n sums over every head: the warp writes its head's share r^3/d sum_i dz P
 * [tokens][N][H] where the parts would be, and a small launch adds each token's H shares in
 * head order (route_block_self_sum_kernel). Added inside the walker instead, a token ahead
 * by the warp that staged them, they made its N 12 instance spill and cost it 0.54 ms a
 * 1B MHAR delta step (H100, 2026-12-07), more than the launch. The dalpha terms each warp
 * adds over its own tokens in their order, and writes once, [G][blocks][H], for the
 * reduction: written a token and a head at a time, 65536 terms a site at the 1B step kept
 * the reduction's one block 110 us a launch (H100, 2026-12-07). */

/* The lane's inputs of token t: the saved weights of its four (source, site) entries
 * (n = g + 8 (e / 2), i = 2c + e % 2: the mma's output fragment), the rstd of its two
 * sources and the centres of its two sites (the replace form's merges); zeros past N, G. */
struct DotsLaneInputs {
    float a[4], r[2], mean[2];
};

__device__ __forceinline__ DotsLaneInputs block_dots_lane_inputs(const BlockDotsArgs &args,
                                                                 long long t, int h, int g,
                                                                 int c)
{
    const int N = args.n_sources, G = args.n_sites, H = args.heads;
    DotsLaneInputs in;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int n = g + 8 * (e >> 1), i = 2 * c + (e & 1);
        in.a[e] = n < N && i < G ? args.weights[i][((long long)n * args.tokens + t) * H + h]
                                 : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int n = g + 8 * r, i = 2 * c + r;
        in.r[r] = n < N ? args.rstd[(long long)n * args.tokens + t] : 0.0f;
        in.mean[r] = i < G && args.means[i] ? args.means[i][t * H + h] : 0.0f;
    }
    return in;
}

/* Token t's coefficients of head h from the warp's fragments (value[e] = D, key[e] = P of
 * source n = g + 8 (e / 2), site i = 2c + e % 2), in the lane's registers:
 *   value[e] = a scale_i,  key[e] = r dz  (zeros past N or G: their a and r are 0),
 *   self_share[r] = r^3 / d sum_i dz P of source g + 8 r over the head's sites (the same
 *                   in the quad's four lanes);
 * the dalpha terms sum_n a D of the lane's two sites added into alpha_sums. */
struct DotsLaneCoefficients {
    float value[4], key[4], self_share[2];
};

__device__ __forceinline__ DotsLaneCoefficients
block_dots_lane_coefficients(const BlockDotsArgs &args, const float (&value)[4],
                             const float (&key)[4], const DotsLaneInputs &in,
                             const float (&scale)[2], float (&alpha_sums)[2])
{
    DotsLaneCoefficients out;
    /* sum_n a D of site 2c + b: the lane's two sources, then across the g lanes */
    float weighted[2];
#pragma unroll
    for (int b = 0; b < 2; b++) {
        weighted[b] = in.a[b] * value[b] + in.a[b + 2] * value[b + 2];
#pragma unroll
        for (int mask = 4; mask < 32; mask <<= 1)
            weighted[b] += __shfl_xor_sync(0xffffffffu, weighted[b], mask);
    }
    float score_grad[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int b = e & 1;
        const float mean = args.means[0] ? in.mean[b] : scale[b] * weighted[b];
        score_grad[e] = in.a[e] * (scale[b] * value[e] - mean);
        out.value[e] = in.a[e] * scale[b];
        out.key[e] = in.r[e >> 1] * score_grad[e];
    }
    /* e_n's share of this head: sum_i dz P over the lane's two sites, then the c lanes */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float product = score_grad[2 * r] * key[2 * r] + score_grad[2 * r + 1] * key[2 * r + 1];
        product += __shfl_xor_sync(0xffffffffu, product, 1);
        product += __shfl_xor_sync(0xffffffffu, product, 2);
        const float rstd = in.r[r];
        out.self_share[r] = rstd * rstd * (rstd * product * args.inverse_width);
    }
#pragma unroll
    for (int b = 0; b < 2; b++)
        alpha_sums[b] += weighted[b];
    return out;
}

#endif
