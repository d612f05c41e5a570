/* kernels/cuda/route_narrow_cuda.cu — the Route forward a warp a token, for rows of d <= 2048,
 * and the test of which shapes take the warp-a-token kernels
 * (DESIGN 2.1; why, layout and limits in route_narrow.cuh; contract in route_cuda.h; the
 * math is route_cuda.cu's and route_backward_cuda.cu's).
 *
 * A block is one warp, so that shared memory is taken a warp at a time.
 *
 * Forward: the warp's rows stream through a ring of NARROW_FORWARD_RING rows in shared
 * memory, NARROW_FORWARD_RING - 1 of them in flight across token boundaries (the sources of
 * a token, then its base in the delta form), so that shared memory does not grow with N.
 * Per source row: the lane's sums of squares and of (q*g) s, reduced over the warp and over
 * the head's lanes; r = rsqrt(squares / d + eps), z = r dot; the online softmax of each head
 * (m' = max(m, z), l' = l e^(m - m') + e^(z - m'), mix' = mix e^(m - m') + e^(z - m') s),
 * each lane for its own head, from the row still in its slot. After the last source:
 * out = mix / l (or base + alpha mix / l), rounded once, and the weights e^(z - m) / l from
 * the scores kept in shared memory. No barrier.
 */
#include "kernels/cuda/route_narrow_device.cuh"

#include <math.h>

bool route_narrow_fits(int n_sources, int d, int heads, const void *const *pointers, int count)
{
    if (d % 256 != 0 || d / 256 > ROUTE_NARROW_MAX_LANE_VECTORS || 32 % heads != 0 ||
        n_sources > ROUTE_NARROW_MAX_SOURCES)
        return false;
    return pointers_aligned(pointers, count, 16) &&
           narrow_backward_bytes(n_sources, d, heads) <= 99 * 1024 &&
           narrow_forward_bytes(n_sources, d, heads) <= 99 * 1024;
}

/* ---- forward ---- */

struct NarrowForwardArgs {
    bf16 *out;
    float *weights; /* [N, tokens, heads] */
    float *rstd;    /* [N, tokens] */
    float *lse;     /* [tokens, heads] or NULL */
    const bf16 *sources[ROUTE_NARROW_MAX_SOURCES];
    const bf16 *query, *key_norm, *base;
    const float *alpha; /* [1] fp32, device (delta form) */
    float eps, inverse_width;
    int n_sources, tokens, heads, lanes_per_head;
};

/* Starts ring item `item` of this warp (item i is row i % rows of its token i / rows:
 * sources, then base) into its slot and commits; an empty group past the warp's tokens. */
template <int LV>
__device__ __forceinline__ void narrow_forward_fetch(BfVector<8> *ring,
                                                     const NarrowForwardArgs &args, int rows,
                                                     long long item, int lane)
{
    const long long t = blockIdx.x + item / rows * gridDim.x;
    const int k = (int)(item % rows);
    if (t < args.tokens)
        narrow_copy_row<LV>(ring + (item % NARROW_FORWARD_RING) * NarrowRow<LV>::VECTORS,
                            k < args.n_sources ? args.sources[k] : args.base, t, lane);
    copy_async_commit();
}

/* 128 registers at d 1280, 16 warps a multiprocessor. Capped at 96 (20 warps) it spilled
 * 44 bytes and ran slower: route-1b forward 4.08 ms against 3.41 ms. */
template <int LV>
__global__ void __launch_bounds__(32)
route_narrow_forward_kernel(const __grid_constant__ NarrowForwardArgs args)
{
    constexpr int C = 8 * LV, VECTORS = NarrowRow<LV>::VECTORS;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    BfVector<8> *ring = reinterpret_cast<BfVector<8> *>(shared_bytes);
    float *scores = reinterpret_cast<float *>(ring + NARROW_FORWARD_RING * VECTORS);
    const int lane = threadIdx.x, N = args.n_sources, H = args.heads, tokens = args.tokens;
    const int rows = N + (args.base ? 1 : 0); /* ring items a token */
    const int head = lane / args.lanes_per_head;
    const bool head_leader = lane % args.lanes_per_head == 0;
    float key_weight[C];
    narrow_key_weight<LV>(args.query, args.key_norm, lane, key_weight);
    const float alpha = args.base ? *args.alpha : 0.0f;

    long long item = 0; /* the item in use; the next NARROW_FORWARD_RING - 1 fly */
    for (int k = 0; k < NARROW_FORWARD_RING - 1; k++)
        narrow_forward_fetch<LV>(ring, args, rows, k, lane);
    for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
        float mix[C], head_max = -INFINITY, head_total = 0.0f;
#pragma unroll
        for (int c = 0; c < C; c++)
            mix[c] = 0.0f;
        for (int k = 0; k < N; k++, item++) {
            narrow_forward_fetch<LV>(ring, args, rows, item + NARROW_FORWARD_RING - 1, lane);
            copy_async_wait<NARROW_FORWARD_RING - 1>(); /* item landed */
            __syncwarp();
            const BfVector<8> *row = ring + (item % NARROW_FORWARD_RING) * VECTORS;

            /* z = r < q*g, s >_head */
            float squares = 0.0f, dot = 0.0f;
#pragma unroll
            for (int j = 0; j < LV; j++) {
                float x[8];
                narrow_read<LV>(row, lane, j, x);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    squares += x[i] * x[i];
                    dot += key_weight[8 * j + i] * x[i];
                }
            }
            squares = warp_sum(squares);
            dot = head_sum(dot, args.lanes_per_head);
            const float r = rsqrtf(squares * args.inverse_width + args.eps);
            const float score = r * dot;
            if (lane == 0)
                args.rstd[(long long)k * tokens + t] = r;
            if (head_leader)
                scores[k * H + head] = score;

            /* the online softmax; the first source's scale is e^-inf = 0 */
            const float new_max = fmaxf(head_max, score);
            const float scale = __expf(head_max - new_max), e = __expf(score - new_max);
            head_total = head_total * scale + e;
            head_max = new_max;
#pragma unroll
            for (int j = 0; j < LV; j++) {
                float x[8];
                narrow_read<LV>(row, lane, j, x);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    mix[8 * j + i] = mix[8 * j + i] * scale + e * x[i];
            }
            __syncwarp(); /* the slot is read before the next fetch refills it */
        }
        /* exact for N a power of two at equal scores */
        const float inverse = __frcp_rn(head_total);

        /* out = mix / l, or base + alpha mix / l (base is the token's last item; out may
         * alias it: the row is in shared memory before out is written) */
        const BfVector<8> *base_row = NULL;
        if (args.base) {
            narrow_forward_fetch<LV>(ring, args, rows, item + NARROW_FORWARD_RING - 1, lane);
            copy_async_wait<NARROW_FORWARD_RING - 1>();
            __syncwarp();
            base_row = ring + (item % NARROW_FORWARD_RING) * VECTORS;
        }
        const long long row_start = (long long)t * (32 * LV);
#pragma unroll
        for (int j = 0; j < LV; j++) {
            float result[8];
            if (base_row) {
                float base_values[8];
                narrow_read<LV>(base_row, lane, j, base_values);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    result[i] = base_values[i] + alpha * (mix[8 * j + i] * inverse);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    result[i] = mix[8 * j + i] * inverse;
            }
            vector_store<8>(args.out, row_start + lane * LV + j, vector_from_floats<8>(result));
        }
        if (args.base) {
            item++;
            __syncwarp(); /* the base slot is read before the next fetch refills it */
        }
        /* a[k] = e^(z_k - m) / l, by the head's first lane, which wrote its scores */
        if (head_leader && args.lse)
            args.lse[(long long)t * H + head] = head_max + __logf(head_total);
        if (head_leader)
            for (int k = 0; k < N; k++)
                args.weights[((long long)k * tokens + t) * H + head] =
                    __expf(scores[k * H + head] - head_max) * inverse;
    }
    copy_async_wait<0>(); /* the empty groups past the last token */
}

template <int LV>
static void narrow_forward_launch(const NarrowForwardArgs &args, size_t bytes,
                                  cudaStream_t stream)
{
    static bool carveout_set;
    if (!carveout_set) {
        CUDA_CHECK(cudaFuncSetAttribute(route_narrow_forward_kernel<LV>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
        carveout_set = true;
    }
    int blocks = resident_blocks(route_narrow_forward_kernel<LV>, 32, bytes,
                                 "the cuda route forward");
    blocks = blocks < args.tokens ? blocks : args.tokens;
    route_narrow_forward_kernel<LV><<<blocks, 32, bytes, stream>>>(args);
    CUDA_CHECK_LAUNCH();
}

void route_narrow_forward(bf16 *out, float *weights, float *rstd, float *lse,
                          const bf16 *const *sources, int n_sources, const bf16 *query,
                          const bf16 *key_norm, const bf16 *base, const float *alpha,
                          int tokens, int d, int heads, float eps, cudaStream_t stream)
{
    NarrowForwardArgs args;
    args.out = out;
    args.weights = weights;
    args.rstd = rstd;
    args.lse = lse;
    for (int k = 0; k < ROUTE_NARROW_MAX_SOURCES; k++)
        args.sources[k] = k < n_sources ? sources[k] : NULL;
    args.query = query;
    args.key_norm = key_norm;
    args.base = base;
    args.alpha = alpha;
    args.eps = eps;
    args.inverse_width = 1.0f / (float)d;
    args.n_sources = n_sources;
    args.tokens = tokens;
    args.heads = heads;
    args.lanes_per_head = 32 / heads;
    const size_t bytes = narrow_forward_bytes(n_sources, d, heads);
    switch (lane_vectors_of(d)) {
    case 1: narrow_forward_launch<1>(args, bytes, stream); break;
    case 2: narrow_forward_launch<2>(args, bytes, stream); break;
    case 3: narrow_forward_launch<3>(args, bytes, stream); break;
    case 4: narrow_forward_launch<4>(args, bytes, stream); break;
    case 5: narrow_forward_launch<5>(args, bytes, stream); break;
    case 6: narrow_forward_launch<6>(args, bytes, stream); break;
    case 7: narrow_forward_launch<7>(args, bytes, stream); break;
    default: narrow_forward_launch<8>(args, bytes, stream); break;
    }
}
