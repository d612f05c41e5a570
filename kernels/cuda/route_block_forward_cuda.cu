/* kernels/cuda/route_block_forward_cuda.cu — phase one of the two-phase Route, forward: the
 * Route of every site of a block over the block's N completed sources, each source read
 * once (contract: route_block_cuda.h; the math is route_cuda.cu's, site by site). Which
 * kernel runs: on tensor cores (FATHOM_ROUTE_BLOCK=mma where heads are whole warps; mma_all,
 * the default, also in route_block_device.cuh's split layout) two tokens a block where
 * N <= 6 (route_block_forward_pair_cuda.cu), else the tensor-core kernel below; otherwise
 * the per-thread kernel.
 *
 * A block a token (persistent grid; the row layout of route_block_device.cuh: thread t owns
 * vector t of the row). Per token:
 *   0. the token's N rows wait in shared memory (cp.async, issued one token ahead into the
 *      other half of a double buffer; a thread reads back only its own copies, so no barrier
 *      guards them) and are read into registers once: N x 16 bytes a thread;
 *   1. sum s^2 of every source (warp_transpose_sum, parts per warp), then for each site i
 *      in turn (two at a time): its q*g (staged in shared memory once a block where it fits,
 *      else two 16-byte loads from L2) against the N rows in registers, the per-head sums
 *      of the N dots into parts; barrier;
 *   2. each warp on its own, for the heads its vectors touch: r of every source from the
 *      warps' squares in warp order, then a lane per (site, head) the softmax over the N
 *      sources into the warp's shared weights (the warps of a head compute the same bits);
 *   3. for each site: result = sum_n a s_n from the rows in registers, rounded once.
 * One barrier a token: the parts are double-buffered by token parity, so the next token's
 * dots do not wait for the slowest warp's softmax (the first version had three barriers a
 * token, with steps 2 and 3 as block-wide serial phases: 0.85 ms at N 9, issue active 66%).
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
#include "kernels/cuda/route_block_forward.cuh"
#include "runtime/error.h"

#include <math.h>

/* Shared memory, in floats after the rows [2][N][threads] x 16 bytes: square parts
 * [2][MAXN][warps] and dot parts [2][G][N][parts] (the tensor-core kernel's [2][parts][G][N],
 * block_mma_dot_at), both double-buffered by token parity, then
 * each warp's softmax weights [warps][G][N][warp_heads_max]. */
struct BlockForwardLayout {
    size_t square_parts, dot_parts, coefficients, total;
    size_t key_weights, launch_bytes; /* key_weights 0: not staged (launch_bytes = total) */
    size_t square_half, dot_half, warp_coefficients; /* floats */
};

static int block_warp_heads_max(const BlockHeads &layout)
{
    int most = 1;
    for (int w = 0; w * layout.warp_vectors < layout.vectors; w++) {
        int first, last;
        block_warp_heads(layout, w, &first, &last);
        most = last - first + 1 > most ? last - first + 1 : most;
    }
    return most;
}

static BlockForwardLayout block_forward_layout(const BlockHeads &heads_layout, int n_sources,
                                               int n_sites)
{
    const int threads = heads_layout.threads, warps = threads / 32;
    BlockForwardLayout layout;
    layout.square_half = (size_t)CUDA_BLOCK_MAX_SOURCES * warps;
    layout.dot_half = (size_t)n_sites * n_sources * heads_layout.parts;
    layout.warp_coefficients =
        (size_t)n_sites * n_sources * block_warp_heads_max(heads_layout);
    layout.square_parts = (size_t)2 * n_sources * threads * 16;
    layout.dot_parts = layout.square_parts + round_up_16(2 * layout.square_half * 4);
    layout.coefficients = layout.dot_parts + round_up_16(2 * layout.dot_half * 4);
    layout.total = layout.coefficients + round_up_16(warps * layout.warp_coefficients * 4);
    layout.key_weights = layout.total;
    layout.launch_bytes = layout.total + block_key_weights_bytes(n_sites, threads);
    if (layout.launch_bytes > BLOCK_SHARED_LIMIT) {
        layout.key_weights = 0;
        layout.launch_bytes = layout.total;
    }
    return layout;
}

size_t route_block_forward_shared_bytes(const BlockHeads &layout, int n_sources, int n_sites)
{
    /* the tensor-core kernel's zero row after the rest */
    return block_forward_layout(layout, n_sources, n_sites).total +
           (layout.tensor_cores ? 16 : 0);
}

/* Step 2 of the forward, by one warp for the heads its vectors touch: r of every source from
 * the warps' squares in warp order, then a lane per (site, head) the softmax over the N
 * sources into the warp's own weights. Every warp that reads a (site, head) computes it from
 * the same parts in the same order: the same bits. The warp holding a head's first vector
 * writes its weights and lse, warp 0 every site's r. */
template <int MAXN>
__device__ __forceinline__ void block_forward_softmax(const BlockForwardArgs &args,
                                                      const float *square_parts,
                                                      const float *dot_parts,
                                                      float *warp_coefficients, long long t)
{
    const BlockHeads &layout = args.layout;
    const int N = args.n_sources, G = args.n_sites, H = args.heads, tokens = args.tokens;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int parts = layout.parts, stride = args.warp_heads_max;
    float r = 0.0f;
    if (lane < N) {
        float total = 0.0f;
        for (int w = 0; w < warps; w++)
            total += square_parts[lane * warps + w];
        r = rsqrtf(total * args.inverse_width + args.eps);
        if (warp == 0)
            for (int i = 0; i < G; i++)
                args.rstd[i][(long long)lane * tokens + t] = r;
    }
    float source_rstd[MAXN];
#pragma unroll
    for (int n = 0; n < MAXN; n++)
        source_rstd[n] = __shfl_sync(0xffffffffu, r, n);

    int first, last;
    block_warp_heads(layout, warp, &first, &last);
    const int span = last - first + 1;
    for (int pair = lane; pair < G * span; pair += 32) {
        const int i = pair / span, h = first + pair - i * span;
        const bool writer = (h * layout.head_vectors) >> 5 == warp;
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
            warp_coefficients[((size_t)i * N + n) * stride + (h - first)] = a;
            if (writer)
                args.weights[i][((long long)n * tokens + t) * H + h] = a;
        }
        if (writer && args.lse[i])
            args.lse[i][t * H + h] = top + __logf(total);
    }
    __syncwarp();
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
    const BlockHeads &layout = args.layout;
    const int N = args.n_sources, G = args.n_sites, tokens = args.tokens;
    const int V = layout.vectors, v = threadIdx.x, parts = layout.parts;
    const bool valid = v < V;
    const SlotPlace place = slot_place_at(v, V, layout.head_vectors, layout.segment_period);
    const int head = valid ? place.head : 0;
    const int half_vectors = N * blockDim.x;
    int first_head, last_head;
    block_warp_heads(layout, threadIdx.x >> 5, &first_head, &last_head);
    float *warp_coefficients = reinterpret_cast<float *>(shared_bytes + shared.coefficients) +
                               (threadIdx.x >> 5) * shared.warp_coefficients;
    const float *coefficient_of_head =
        warp_coefficients + (valid ? head - first_head : 0); /* [G][N] at stride */
    const int stride = args.warp_heads_max;

    float4 *key_weights =
        shared.key_weights ? reinterpret_cast<float4 *>(shared_bytes + shared.key_weights)
                           : NULL;
    block_key_weights_stage(key_weights, args.query, args.key_norm, G, v, valid);

    int half = 0;
    block_fetch_rows(rows, args.sources, N, blockIdx.x, tokens, V, valid);
    for (long long t = blockIdx.x; t < tokens; t += gridDim.x, half ^= 1) {
        block_fetch_rows(rows + (half ^ 1) * half_vectors, args.sources, N, t + gridDim.x,
                         tokens, V, valid);
        copy_async_wait<1>(); /* this token's rows have landed */
        float *squares = square_parts + half * shared.square_half;
        float *dots = dot_parts + half * shared.dot_half;
        /* the rows as floats, converted once: every site reads every row twice */
        float x[MAXN][8];
        block_rows_to_floats<MAXN>(rows + half * half_vectors, N, valid, x);

        /* 1. squares, then each site's dots, reduced over heads into parts */
        float sums[MAXN];
#pragma unroll
        for (int n = 0; n < MAXN; n++) {
            sums[n] = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++)
                sums[n] += x[n][k] * x[n][k];
        }
        block_row_reduce<MAXN>(sums, squares, N);
        /* two sites at a time: each row element, converted from bf16 where it is used,
         * serves two products (a site at a time, the conversions were as many as the
         * multiply-adds: 60% of the kernel's instructions went to them and to the dots) */
        for (int i = 0; i < G; i += 2) {
            const bool second = i + 1 < G; /* uniform */
            const int other = second ? i + 1 : i;
            float key_weight[2][8];
            block_key_weight(key_weights, args.query[i], args.key_norm[i], i, v, valid,
                             key_weight[0]);
            block_key_weight(key_weights, args.query[other], args.key_norm[other], other, v,
                             valid, key_weight[1]);
            float pair_sums[2][MAXN];
#pragma unroll
            for (int n = 0; n < MAXN; n++) {
                pair_sums[0][n] = pair_sums[1][n] = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    pair_sums[0][n] += key_weight[0][k] * x[n][k];
                    pair_sums[1][n] += key_weight[1][k] * x[n][k];
                }
            }
            block_head_reduce<MAXN>(pair_sums[0], dots + (size_t)i * N * parts, parts, 1, N,
                                    layout, place);
            if (second)
                block_head_reduce<MAXN>(pair_sums[1], dots + (size_t)(i + 1) * N * parts, parts,
                                        1, N, layout, place);
        }
        /* the only barrier of a token: the parts are complete. This half of the parts is
         * rewritten two tokens on, after the next token's barrier, which every warp reaches
         * after its reads below; the warps' weights are rewritten after it too. */
        __syncthreads();

        /* 2. each warp's softmax for its heads */
        block_forward_softmax<MAXN>(args, squares, dots, warp_coefficients, t);

        /* 3. each site's mix of the raw rows, fp32, rounded once; two sites at a time as
         * the dots */
        if (valid)
            for (int i = 0; i < G; i += 2) {
                const bool second = i + 1 < G;
                const float *a0 = coefficient_of_head + (size_t)i * N * stride;
                const float *a1 = second ? a0 + (size_t)N * stride : a0;
                float mix[2][8] = {};
#pragma unroll
                for (int n = 0; n < MAXN; n++) {
                    if (n >= N)
                        continue;
                    const float weight0 = a0[n * stride], weight1 = a1[n * stride];
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        mix[0][k] += weight0 * x[n][k];
                        mix[1][k] += weight1 * x[n][k];
                    }
                }
                vector_store<8>(args.results[i], t * V + v, vector_from_floats<8>(mix[0]));
                if (second)
                    vector_store<8>(args.results[i + 1], t * V + v,
                                    vector_from_floats<8>(mix[1]));
            }
    }
    copy_async_wait<0>(); /* the empty groups past the last token */
}

/* ---- on tensor cores (FATHOM_ROUTE_BLOCK=mma): the same steps, a warp's K_STEPS x 16
 * channels at a time (route_block_mma.cuh): 256 where heads are whole warps, 128-192 in the
 * split layout (mma_all). N <= 16, G <= 8. Per token and warp at 16 k-steps: 16 ldmatrix and
 * 48-64 mma for the dots and the squares (the diagonal of the rows' Gram product), 16
 * ldmatrix and 64 mma for the mix, against some 3,400 instructions a thread on the kernel
 * above. ---- */

template <int MAXN, int K_STEPS>
__global__ void __launch_bounds__(BLOCK_MAX_THREADS, 1)
    route_block_forward_mma_kernel(const __grid_constant__ BlockForwardArgs args,
                                   BlockForwardLayout shared)
{
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    BfVector<8> *rows = reinterpret_cast<BfVector<8> *>(shared_bytes);
    BfVector<8> *zero = reinterpret_cast<BfVector<8> *>(shared_bytes + shared.total);
    float *square_parts = reinterpret_cast<float *>(shared_bytes + shared.square_parts);
    float *dot_parts = reinterpret_cast<float *>(shared_bytes + shared.dot_parts);
    const int N = args.n_sources, G = args.n_sites, tokens = args.tokens;
    const int V = args.layout.vectors, stride = args.warp_heads_max;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    /* the warp's first slot of a staged row (32 a warp) and its first vector of the row */
    const int first_slot = warp * 32, first_vector = warp * 2 * K_STEPS;
    float *warp_coefficients = reinterpret_cast<float *>(shared_bytes + shared.coefficients) +
                               warp * shared.warp_coefficients;
    const int half_vectors = N * blockDim.x;
    /* the first token's rows travel while q*g's fragments are made */
    block_mma_fetch_rows<MAXN, K_STEPS>(rows, args.sources, N, blockIdx.x, tokens, V);
    uint32_t key_weights[K_STEPS][4];
    block_mma_begin<K_STEPS>(zero, key_weights, args.query, args.key_norm, G);

    int half = 0;
    for (long long t = blockIdx.x; t < tokens; t += gridDim.x, half ^= 1) {
        block_mma_fetch_rows<MAXN, K_STEPS>(rows + (half ^ 1) * half_vectors, args.sources,
                                            N, t + gridDim.x, tokens, V);
        copy_async_wait<1>();
        __syncwarp(); /* the warp's slots, each copied by one of its lanes, have landed */
        const BfVector<8> *token_rows = rows + half * half_vectors;

        /* 1. D[n][i]: the warp's part of < s_n, q_i g_i >; the Gram product's diagonal:
         * its part of sum s_n^2 */
        /* q*g's hi and lo halves go into accumulators of their own, so that the K_STEPS
         * k-steps are two chains of dependent mma, not one of twice as many (`wait` was the
         * kernel's second stall, 2026-12-02); they are added once, in fp32 */
        float dots_high[4] = {0, 0, 0, 0}, dots_low[4] = {0, 0, 0, 0};
        float gram_low[4] = {0, 0, 0, 0}, gram_high[4] = {0, 0, 0, 0};
#pragma unroll
        for (int s = 0; s < K_STEPS; s++) {
            uint32_t a[4];
            block_ldmatrix_x4(a, block_mma_row_address(token_rows, zero, N, first_slot + 2 * s,
                                                       lane));
            block_mma(dots_high, a, key_weights[s][0], key_weights[s][1]);
            /* (past 8 sources the Gram's second half needs the registers: one chain) */
            block_mma(MAXN > 8 ? dots_high : dots_low, a, key_weights[s][2], key_weights[s][3]);
            block_mma(gram_low, a, a[0], a[2]); /* B = the rows themselves, sources 0-7 */
            if (MAXN > 8)
                block_mma(gram_high, a, a[1], a[3]); /* sources 8-15 */
        }
        float dots[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            dots[e] = dots_high[e] + dots_low[e];
        float *squares = square_parts + half * shared.square_half;
        float *dot = dot_parts + half * shared.dot_half;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = g + 8 * (e >> 1), i = 2 * c + (e & 1);
            if (n < N && i < G)
                dot[block_mma_dot_at(warp, i, n, G, N)] = dots[e];
        }
        /* (g, g) sits in element 0 where g = 2c, in 1 where g = 2c + 1: chosen by select,
         * since an array indexed at run time lives in local memory (ptxas stored gram_low
         * there after every k-step) */
        const int diagonal = g - 2 * c;
        if (diagonal == 0 || diagonal == 1) {
            if (g < N)
                squares[g * warps + warp] = diagonal ? gram_low[1] : gram_low[0];
            if (MAXN > 8 && g + 8 < N)
                squares[(g + 8) * warps + warp] = diagonal ? gram_high[3] : gram_high[2];
        }
        __syncthreads(); /* the parts are complete (double-buffered, as above) */

        /* 2. the warp's softmax, all lanes at work */
        const BlockSitePointers site_out = block_site_pointers(args, g);
        block_forward_mma_softmax<MAXN>(args, site_out, squares, dot, warp_coefficients, t);

        /* 3. the mix: A = the weights of site g over sources 2c, 2c+1 (+8), in two halves */
        uint32_t weights_high[4] = {0, 0, 0, 0}, weights_low[4] = {0, 0, 0, 0};
        {
            float w[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = 2 * c + (e & 1) + 8 * (e >> 1);
                w[e] = g < G && n < N ? warp_coefficients[((size_t)g * N + n) * stride] : 0.0f;
            }
            block_mma_split(w[0], w[1], &weights_high[0], &weights_low[0]);
            block_mma_split(w[2], w[3], &weights_high[2], &weights_low[2]);
        }
        bf16 *result = g < G ? site_out.result + t * V * 8 : NULL; /* channel 0 of the row */
        /* Not unrolled, so nothing spills (at unroll 2 or 4 ptxas spilled 16-56 bytes a
         * thread, into an L1 the shared memory leaves at 28 KB); instead the next tiles' load
         * is issued a step ahead, and the four products of a step are independent (hi and lo
         * added after, in fp32), so a step waits for one mma, not two in a row. */
        uint32_t b[4]; /* tile j: b[0], b[1] (sources 0-7, 8-15); tile j + 1: b[2], b[3] */
        block_ldmatrix_x4_trans(b, block_mma_row_address(token_rows, zero, N, first_slot,
                                                         lane));
#pragma unroll 1
        for (int j = 0; j < 2 * K_STEPS; j += 2) {
            uint32_t next[4];
            if (j + 2 < 2 * K_STEPS)
                block_ldmatrix_x4_trans(next, block_mma_row_address(token_rows, zero, N,
                                                                    first_slot + j + 2, lane));
            float tiles[2][4];
            block_mma_mix_step(tiles, weights_high, weights_low, b);
            block_mma_store_quad(result ? reinterpret_cast<uint32_t *>(
                                              result + (first_vector + j) * 8)
                                        : NULL,
                                 block_mma_pack(tiles[0][0], tiles[0][1]),
                                 block_mma_pack(tiles[1][0], tiles[1][1]), result != NULL,
                                 lane);
#pragma unroll
            for (int e = 0; e < 4; e++)
                b[e] = next[e];
        }
        __syncwarp(); /* this half's slots are read before the next token refills them */
    }
    copy_async_wait<0>();
}

enum { ROUTE_BLOCK_SIMT, ROUTE_BLOCK_MMA, ROUTE_BLOCK_MMA_ALL };

static int route_block_kernels(void)
{
    static int selected = -1; /* read once */
    if (selected < 0) {
        static const char *const names[] = {"mma_all", "mma", "simt"};
        static const int kernels[] = {ROUTE_BLOCK_MMA_ALL, ROUTE_BLOCK_MMA, ROUTE_BLOCK_SIMT};
        selected = kernels[env_choice("FATHOM_ROUTE_BLOCK", names, 3)];
    }
    return selected;
}

extern "C" bool cuda_route_block_tensor_cores(void)
{
    return route_block_kernels() != ROUTE_BLOCK_SIMT;
}

extern "C" bool cuda_route_block_split_heads(void)
{
    return route_block_kernels() == ROUTE_BLOCK_MMA_ALL;
}

bool route_block_fits(int n_sources, int n_sites, int d, int heads)
{
    if (n_sources < 1 || n_sources > CUDA_BLOCK_MAX_SOURCES || n_sites < 1 ||
        n_sites > CUDA_BLOCK_MAX_SITES || d % 8 != 0 || d / 8 > BLOCK_MAX_THREADS ||
        heads < 1 || heads > CUDA_ROUTE_MAX_HEADS || d % heads != 0 || (d / heads) % 8 != 0)
        return false;
    const BlockHeads layout = block_heads(n_sources, n_sites, d, heads);
    return route_block_forward_shared_bytes(layout, n_sources, n_sites) <= BLOCK_SHARED_LIMIT &&
           route_block_dots_shared_bytes(layout, n_sources, n_sites) <= BLOCK_SHARED_LIMIT;
}

template <int MAXN, int K_STEPS>
static void block_forward_mma_launch(const BlockForwardArgs &args, int threads,
                                     const BlockForwardLayout &layout, cudaStream_t stream)
{
    const size_t bytes = layout.total + 16; /* and the zero row */
    const int blocks = block_persistent_grid<route_block_forward_mma_kernel<MAXN, K_STEPS>>(
        threads, bytes, args.tokens, "the cuda block route forward");
    route_block_forward_mma_kernel<MAXN, K_STEPS>
        <<<blocks, threads, bytes, stream>>>(args, layout);
}

template <int MAXN>
static void block_forward_launch(const BlockForwardArgs &args, int threads,
                                 const BlockForwardLayout &layout, cudaStream_t stream)
{
    if (args.layout.tensor_cores) {
        switch (args.layout.k_steps) { /* route_block_device.cuh's split layout, or 16 */
        case 8: block_forward_mma_launch<MAXN, 8>(args, threads, layout, stream); break;
        case 10: block_forward_mma_launch<MAXN, 10>(args, threads, layout, stream); break;
        case 12: block_forward_mma_launch<MAXN, 12>(args, threads, layout, stream); break;
        default: block_forward_mma_launch<MAXN, 16>(args, threads, layout, stream); break;
        }
    } else {
        const int blocks = block_persistent_grid<route_block_forward_kernel<MAXN>>(
            threads, layout.launch_bytes, args.tokens, "the cuda block route forward");
        route_block_forward_kernel<MAXN>
            <<<blocks, threads, layout.launch_bytes, stream>>>(args, layout);
    }
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
    args.layout = block_heads(n_sources, n_sites, d, heads);
    args.eps = eps;
    args.inverse_width = 1.0f / (float)d;
    args.n_sources = n_sources;
    args.n_sites = n_sites;
    args.tokens = tokens;
    args.heads = heads;
    args.warp_heads_max = block_warp_heads_max(args.layout);
    const int threads = args.layout.threads;
    if (route_block_forward_pairs(args, threads, stream))
        return; /* two tokens a block on tensor cores (route_block_forward_pair_cuda.cu) */
    const BlockForwardLayout layout = block_forward_layout(args.layout, n_sources, n_sites);
    if (n_sources <= 2)
        block_forward_launch<2>(args, threads, layout, stream);
    else if (n_sources <= 4)
        block_forward_launch<4>(args, threads, layout, stream);
    else if (n_sources <= 6)
        block_forward_launch<6>(args, threads, layout, stream);
    else if (n_sources <= 9)
        block_forward_launch<9>(args, threads, layout, stream);
    else
        block_forward_launch<CUDA_BLOCK_MAX_SOURCES>(args, threads, layout, stream);
}
