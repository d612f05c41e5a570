/* kernels/cuda/route_block_forward_cuda.cu — phase one of the two-phase Route, forward: the
 * Route of every site of a block over the block's N completed sources, each source read
 * once (contract: route_block_cuda.h; the math is route_cuda.cu's, site by site).
 *
 * A block a token (persistent grid; layout in route_block_device.cuh: thread t owns vector t
 * of the row). Per token:
 *   0. the token's N rows wait in shared memory (cp.async, issued one token ahead into the
 *      other half of a double buffer; a thread reads back only its own copies, so no barrier
 *      guards them) and are read into registers once: N x 16 bytes a thread;
 *   1. sum s^2 of every source (warp_transpose_sum, parts per warp), then for each site i
 *      in turn: its q*g (two 16-byte loads from L1) against the N rows in registers, the
 *      per-head sums of the N dots into parts; barrier;
 *   2. a thread per source: r from the warps' squares in warp order (saved in every site's
 *      rstd); barrier;
 *   3. a thread per (site, head): z = r * dot from the head's parts in order, the softmax
 *      over the N sources, weights and lse saved, a into shared memory; barrier;
 *   4. for each site: result = sum_n a s_n from the rows in registers, rounded once.
 * Three barriers a token, whatever N and G.
 *
 * How fast should this be (H200: 4.3 TB/s copy, ~67 TFLOP/s fp32). Per token it reads N rows
 * and writes G: (N + G) * 2d bytes. At the 8B graft (d 4096, H 8, 8192 tokens a microbatch,
 * 8 blocks of G = 8 over N = 2..9, sum N = 44) that is (44 + 64) rows of 67 MB = 7.2 GB, a
 * floor of 1.7 ms a microbatch, against 32.2 GB (7.5 ms) when every site reads its own. The
 * arithmetic is 2 G N d multiply-adds a token (dots and mixes) plus the conversions, about
 * (33 G N + 40 G) instructions a thread a token: at N = 9, G = 8 and 16 warps a token,
 * 44k warp instructions against the 33k issue slots its 136 KB take at the copy rate; at the
 * average N (5.5) the two are even. Expected about 2.2 ms a microbatch at the 8B graft.
 * Shared memory: 2 N 16-byte vectors a thread (147 KB at d 4096, N 9: one block of 16 warps
 * a multiprocessor, the next token's 72 KB in flight); registers about 100 at MAXN 9.
 */
#include "kernels/cuda/route_block_device.cuh"

#include <math.h>

struct BlockForwardArgs {
    bf16 *results[CUDA_BLOCK_MAX_SITES];
    float *weights[CUDA_BLOCK_MAX_SITES]; /* [N, tokens, H] */
    float *rstd[CUDA_BLOCK_MAX_SITES];    /* [N, tokens] */
    float *lse[CUDA_BLOCK_MAX_SITES];     /* [tokens, H] or NULL */
    const bf16 *sources[CUDA_BLOCK_MAX_SOURCES];
    const bf16 *query[CUDA_BLOCK_MAX_SITES], *key_norm[CUDA_BLOCK_MAX_SITES];
    BlockHeads layout;
    float eps, inverse_width;
    int n_sources, n_sites, tokens, heads;
};

/* Shared memory, in floats after the rows [2][N][threads] x 16 bytes: square parts
 * [MAXN][warps], dot parts [G][N][parts], r [N], a [G][N][H]. */
struct BlockForwardLayout {
    size_t square_parts, dot_parts, rstd, coefficients, total;
};

static BlockForwardLayout block_forward_layout(int n_sources, int n_sites, int d, int heads)
{
    const BlockHeads heads_layout = block_heads(d, heads);
    const int threads = (heads_layout.vectors + 31) / 32 * 32, warps = threads / 32;
    BlockForwardLayout layout;
    layout.square_parts = (size_t)2 * n_sources * threads * 16;
    layout.dot_parts = layout.square_parts + round_up_16((size_t)CUDA_BLOCK_MAX_SOURCES * warps * 4);
    layout.rstd = layout.dot_parts +
                  round_up_16((size_t)n_sites * n_sources * heads_layout.parts * 4);
    layout.coefficients = layout.rstd + round_up_16((size_t)n_sources * 4);
    layout.total = layout.coefficients + round_up_16((size_t)n_sites * n_sources * heads * 4);
    return layout;
}

size_t route_block_forward_shared_bytes(int n_sources, int n_sites, int d, int heads)
{
    return block_forward_layout(n_sources, n_sites, d, heads).total;
}

/* Starts the copies of this thread's vector of token t's N rows into one half of the buffer
 * and commits (an empty group past the tokens, so that every wait counts the same groups). */
__device__ __forceinline__ void block_forward_fetch(BfVector<8> *half, const BlockForwardArgs &args,
                                                    long long t, bool valid)
{
    if (t < args.tokens && valid)
        for (int n = 0; n < args.n_sources; n++)
            copy_vector_async<8>(half + n * blockDim.x + threadIdx.x, args.sources[n],
                                 t * args.layout.vectors + threadIdx.x);
    copy_async_commit();
}

template <int MAXN>
__global__ void __launch_bounds__(BLOCK_MAX_THREADS, 1)
    route_block_forward_kernel(const __grid_constant__ BlockForwardArgs args,
                               BlockForwardLayout shared)
{
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    BfVector<8> *rows = reinterpret_cast<BfVector<8> *>(shared_bytes);
    float *square_parts = reinterpret_cast<float *>(shared_bytes + shared.square_parts);
    float *dot_parts = reinterpret_cast<float *>(shared_bytes + shared.dot_parts);
    float *source_rstd = reinterpret_cast<float *>(shared_bytes + shared.rstd);
    float *coefficients = reinterpret_cast<float *>(shared_bytes + shared.coefficients);
    const BlockHeads &layout = args.layout;
    const int N = args.n_sources, G = args.n_sites, H = args.heads, tokens = args.tokens;
    const int V = layout.vectors, v = threadIdx.x, parts = layout.parts;
    const bool valid = v < V;
    const SlotPlace place = slot_place_at(v, V, layout.head_vectors, layout.segment_period);
    const int head = valid ? place.head : 0;
    const int half_vectors = N * blockDim.x;

    int half = 0;
    block_forward_fetch(rows, args, blockIdx.x, valid);
    for (long long t = blockIdx.x; t < tokens; t += gridDim.x, half ^= 1) {
        block_forward_fetch(rows + (half ^ 1) * half_vectors, args, t + gridDim.x, valid);
        copy_async_wait<1>(); /* this token's rows have landed */
        /* the rows as floats, converted once: every site reads every row twice */
        float x[MAXN][8];
#pragma unroll
        for (int n = 0; n < MAXN; n++)
            vector_to_floats<8>(n < N && valid ? rows[half * half_vectors + n * blockDim.x + v]
                                               : vector_zero<8>(),
                                x[n]);

        /* 1. squares, then each site's dots, reduced over heads into parts */
        float sums[MAXN];
#pragma unroll
        for (int n = 0; n < MAXN; n++) {
            sums[n] = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++)
                sums[n] += x[n][k] * x[n][k];
        }
        block_row_reduce<MAXN>(sums, square_parts, N);
        for (int i = 0; i < G; i++) {
            float key_weight[8] = {0};
            if (valid) {
                float q[8], g[8];
                vector_to_floats<8>(vector_load<8>(args.query[i], v), q);
                vector_to_floats<8>(vector_load<8>(args.key_norm[i], v), g);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    key_weight[k] = q[k] * g[k];
            }
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                sums[n] = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    sums[n] += key_weight[k] * x[n][k];
            }
            block_head_reduce<MAXN>(sums, dot_parts + (size_t)i * N * parts, parts, N, layout,
                                    place);
        }
        __syncthreads();

        /* 2. r of each source, the warps' squares in warp order */
        const int warps = blockDim.x >> 5;
        for (int n = threadIdx.x; n < N; n += blockDim.x) {
            float total = 0.0f;
            for (int w = 0; w < warps; w++)
                total += square_parts[n * warps + w];
            const float r = rsqrtf(total * args.inverse_width + args.eps);
            source_rstd[n] = r;
            for (int i = 0; i < G; i++)
                args.rstd[i][(long long)n * tokens + t] = r;
        }
        __syncthreads();

        /* 3. the softmax of each (site, head) over the N sources */
        for (int pair = threadIdx.x; pair < G * H; pair += blockDim.x) {
            const int i = pair / H, h = pair - i * H;
            int from, to;
            block_head_parts(layout, h, &from, &to);
            float z[MAXN], top = -INFINITY;
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                z[n] = -INFINITY;
                if (n >= N)
                    continue;
                const float *dots = dot_parts + ((size_t)i * N + n) * parts;
                float dot = 0.0f;
                for (int p = from; p <= to; p++)
                    dot += dots[p];
                z[n] = source_rstd[n] * dot;
                top = fmaxf(top, z[n]);
            }
            float total = 0.0f;
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                z[n] = n < N ? __expf(z[n] - top) : 0.0f;
                total += z[n];
            }
            const float inverse = __frcp_rn(total); /* exact for N a power of two at equal scores */
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                if (n >= N)
                    continue;
                const float a = z[n] * inverse;
                coefficients[((size_t)i * N + n) * H + h] = a;
                args.weights[i][((long long)n * tokens + t) * H + h] = a;
            }
            if (args.lse[i])
                args.lse[i][t * H + h] = top + __logf(total);
        }
        __syncthreads();

        /* 4. each site's mix of the raw rows, fp32, rounded once */
        if (valid)
            for (int i = 0; i < G; i++) {
                const float *a = coefficients + (size_t)i * N * H + head;
                float mix[8] = {0};
#pragma unroll
                for (int n = 0; n < MAXN; n++) {
                    if (n >= N)
                        continue;
                    const float weight = a[n * H];
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        mix[k] += weight * x[n][k];
                }
                vector_store<8>(args.results[i], t * V + v, vector_from_floats<8>(mix));
            }
        /* the parts, r and coefficients are rewritten only after the next token's first
         * barrier, which every thread reaches after these reads */
    }
    copy_async_wait<0>(); /* the empty groups past the last token */
}

bool route_block_fits(int n_sources, int n_sites, int d, int heads)
{
    if (n_sources < 1 || n_sources > CUDA_BLOCK_MAX_SOURCES || n_sites < 1 ||
        n_sites > CUDA_BLOCK_MAX_SITES || d % 8 != 0 || d / 8 > BLOCK_MAX_THREADS ||
        heads < 1 || heads > CUDA_ROUTE_MAX_HEADS || d % heads != 0 || (d / heads) % 8 != 0)
        return false;
    return route_block_forward_shared_bytes(n_sources, n_sites, d, heads) <= BLOCK_SHARED_LIMIT &&
           route_block_dots_shared_bytes(n_sources, n_sites, d, heads) <= BLOCK_SHARED_LIMIT;
}

template <int MAXN>
static void block_forward_launch(const BlockForwardArgs &args, int threads,
                                 const BlockForwardLayout &layout, cudaStream_t stream)
{
    static bool carveout_set;
    if (!carveout_set) {
        CUDA_CHECK(cudaFuncSetAttribute(route_block_forward_kernel<MAXN>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
        carveout_set = true;
    }
    int blocks = resident_blocks(route_block_forward_kernel<MAXN>, threads, layout.total,
                                 "the cuda block route forward");
    blocks = blocks < args.tokens ? blocks : args.tokens;
    route_block_forward_kernel<MAXN><<<blocks, threads, layout.total, stream>>>(args, layout);
    CUDA_CHECK_LAUNCH();
}

void route_block_forward_fast(bf16 *const *results, float *const *weights, float *const *rstd,
                              float *const *lse, const bf16 *const *sources, int n_sources,
                              const bf16 *const *queries, const bf16 *const *key_norms,
                              int n_sites, int tokens, int d, int heads, float eps,
                              cudaStream_t stream)
{
    BlockForwardArgs args = {};
    for (int i = 0; i < n_sites; i++) {
        args.results[i] = results[i];
        args.weights[i] = weights[i];
        args.rstd[i] = rstd[i];
        args.lse[i] = lse ? lse[i] : NULL;
        args.query[i] = queries[i];
        args.key_norm[i] = key_norms[i];
    }
    for (int n = 0; n < n_sources; n++)
        args.sources[n] = sources[n];
    args.layout = block_heads(d, heads);
    args.eps = eps;
    args.inverse_width = 1.0f / (float)d;
    args.n_sources = n_sources;
    args.n_sites = n_sites;
    args.tokens = tokens;
    args.heads = heads;
    const int threads = (args.layout.vectors + 31) / 32 * 32;
    const BlockForwardLayout layout = block_forward_layout(n_sources, n_sites, d, heads);
    if (n_sources <= 2)
        block_forward_launch<2>(args, threads, layout, stream);
    else if (n_sources <= 4)
        block_forward_launch<4>(args, threads, layout, stream);
    else if (n_sources <= 6)
        block_forward_launch<6>(args, threads, layout, stream);
    else
        block_forward_launch<CUDA_BLOCK_MAX_SOURCES>(args, threads, layout, stream);
}
