/* kernels/cuda/attention_cuda.cu — causal grouped-KV flash attention, forward
 * (see attention_cuda.h; fragment and tile layouts in attention_tiles.cuh).
 *
 * K and V cross L2 once per KV group, not once per query head: one CTA of four warpgroups
 * takes 256 query rows that all read the same K, V, namely the same 64 queries of the four
 * query heads of a group (heads_per_block 4: group size 4, 8, ...), or 128 queries of two
 * heads (group size 2, 6, ...), or 256 queries of one head (odd group sizes). Each warpgroup
 * owns 64 rows of one head and keeps their output accumulators [64, head_dim] fp32 and running
 * max / sum in registers. Every K, V tile in shared memory feeds 256 rows, so the bytes read
 * through L2 per FLOP are half those of a 128-row CTA; stacking a group's heads rather than
 * more queries of one head keeps the four warpgroups on the same diagonal (none idles while
 * the others mask). Key blocks of 64 are walked from the diagonal down to 0 (only a
 * warpgroup's first block, its diagonal one, needs the causal mask). K and V move through a
 * ring of three shared-memory stages, loaded two blocks ahead by the whole CTA.
 *
 * 512 threads leave 128 registers a thread: O (64 at head_dim 128), the scores (32) and the
 * probabilities (16) cannot all be live at once, so a warpgroup runs its block in order (S_i =
 * Q K_i^T, softmax, rescale O to the new running max, O += P_i V_i) and the four warpgroups of
 * the multiprocessor overlap one another's softmax with the tensor cores. The softmax runs in
 * base 2 with the 1/sqrt(head_dim) * log2(e) scale folded into one FMA per score. CTAs are
 * launched heaviest first (the last query block sees every key) so the tail of the grid is
 * short CTAs.
 */
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "runtime/error.h"

#include <cuda_runtime.h>
#include <math.h>

#define FORWARD_WARPGROUPS 4 /* 512 threads: at most 128 registers a thread */
#define FORWARD_ROWS (FORWARD_WARPGROUPS * WARPGROUP_ROWS) /* query rows a CTA holds */
#define FORWARD_BLOCK_KEYS 64
#define FORWARD_STAGES 3 /* K, V ring: block i + 2 loads into the stage block i - 1 left
                          * while block i is computed */
#define FORWARD_THREADS (FORWARD_WARPGROUPS * WARPGROUP_THREADS)
static_assert(FORWARD_BLOCK_KEYS == 64 && WARPGROUP_ROWS == 64,
              "the score and probability fragments below hold 64 x 64 tiles");

/* Q tile [FORWARD_ROWS, HEAD_DIM] (the warpgroups' 64-row tiles one after the other), then the
 * K ring and the V ring [FORWARD_STAGES][64, HEAD_DIM], all packed; the fp32 output staging
 * area of the end reuses the same memory. */
template <int HEAD_DIM>
__host__ __device__ static constexpr size_t forward_shared_bytes(void)
{
    return (size_t)(FORWARD_ROWS + 2 * FORWARD_STAGES * FORWARD_BLOCK_KEYS) * HEAD_DIM *
           sizeof(__nv_bfloat16);
}

/* The query heads one CTA takes, all of one KV group: the largest count that divides both
 * the group (n_heads / n_kv_heads) and FORWARD_WARPGROUPS (a power of two), so 1, 2 or 4. Its
 * warpgroups hold FORWARD_WARPGROUPS / heads query tiles of 64 for each head. */
static int forward_heads_per_block(int n_heads, int n_kv_heads)
{
    int group = n_heads / n_kv_heads, heads = FORWARD_WARPGROUPS;
    while (group % heads != 0)
        heads /= 2;
    return heads;
}

/* out [B, T, n_heads, HEAD_DIM], lse [B, n_heads, T] from q [B, T, n_heads, HEAD_DIM], k, v
 * [B, T, n_kv_heads, HEAD_DIM]; grid (n_heads / heads_per_block, B, query blocks of
 * FORWARD_ROWS / heads_per_block), FORWARD_THREADS threads; heads_per_block divides both
 * n_heads / n_kv_heads and FORWARD_WARPGROUPS; scale_log2 = log2(e) / sqrt(HEAD_DIM). */
template <int HEAD_DIM>
__global__ void __launch_bounds__(FORWARD_THREADS, 1)
attention_forward_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                         const __nv_bfloat16 *k, const __nv_bfloat16 *v, int T, int n_heads,
                         int n_kv_heads, int heads_per_block, float scale_log2)
{
    constexpr int block_keys = FORWARD_BLOCK_KEYS;
    constexpr int stage_elements = block_keys * HEAD_DIM;
    static_assert(forward_shared_bytes<HEAD_DIM>() >=
                      (size_t)FORWARD_ROWS * (HEAD_DIM + STAGE_PAD) * sizeof(float),
                  "the output staging area must fit in the tiles' memory");
    extern __shared__ __align__(128) unsigned char shared[];
    __nv_bfloat16 *q_tile = reinterpret_cast<__nv_bfloat16 *>(shared);
    __nv_bfloat16 *k_ring = q_tile + FORWARD_ROWS * HEAD_DIM;
    __nv_bfloat16 *v_ring = k_ring + FORWARD_STAGES * stage_elements;

    /* warpgroup w takes head first_head + w % heads_per_block, query tile w / heads_per_block;
     * every head of the CTA belongs to one KV group, so one K, V walk serves all its rows */
    int first_head = blockIdx.x * heads_per_block, batch = blockIdx.y;
    int block_queries = FORWARD_ROWS / heads_per_block;
    int query_block = gridDim.z - 1 - blockIdx.z;
    int kv_head = first_head / (n_heads / n_kv_heads);
    /* broadcast from lane 0, so the compiler sees it is warp-uniform: a product under a branch
     * it cannot prove uniform would be serialised */
    int group = __shfl_sync(0xffffffffu, (int)threadIdx.x / WARPGROUP_THREADS, 0);
    int head = first_head + group % heads_per_block;
    int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    int g = lane / 4, c = lane % 4;
    size_t q_stride = (size_t)n_heads * HEAD_DIM, kv_stride = (size_t)n_kv_heads * HEAD_DIM;
    const __nv_bfloat16 *q_batch = q + (size_t)batch * T * q_stride;
    const __nv_bfloat16 *k_base = k + (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    const __nv_bfloat16 *v_base = v + (size_t)batch * T * kv_stride + (size_t)kv_head * HEAD_DIM;
    int query0 = query_block * block_queries;
    int group_row0 = query0 + group / heads_per_block * WARPGROUP_ROWS;
    /* CTA iteration i holds key block last_block - i */
    int last_block = (min(T, query0 + block_queries) - 1) / block_keys;
    int blocks = last_block + 1;
    /* A warpgroup starts at its diagonal block: one iteration late when the CTA's last block
     * lies wholly past its rows, never when it has no row before T. */
    int first = group_row0 < T ? last_block - group_row0 / block_keys : blocks;
    /* the two query rows of this thread's accumulator elements (d[t][0..1], d[t][2..3]) */
    int query_row[2] = {group_row0 + warp * 16 + g, group_row0 + warp * 16 + g + 8};
    const __nv_bfloat16 *q_rows = q_tile + group * WARPGROUP_ROWS * HEAD_DIM;

    auto load_block = [&](int iteration) {
        int stage = iteration % FORWARD_STAGES, key0 = (last_block - iteration) * block_keys;
        packed_tile_load_async<block_keys, HEAD_DIM, FORWARD_THREADS>(
            k_ring + stage * stage_elements, k_base, kv_stride, key0, T);
        packed_tile_load_async<block_keys, HEAD_DIM, FORWARD_THREADS>(
            v_ring + stage * stage_elements, v_base, kv_stride, key0, T);
    };
    /* groups in flight: {Q, block 0}, {block 1} (possibly empty) */
    for (int slot = 0; slot < FORWARD_WARPGROUPS; slot++)
        packed_tile_load_async<WARPGROUP_ROWS, HEAD_DIM, FORWARD_THREADS>(
            q_tile + slot * WARPGROUP_ROWS * HEAD_DIM,
            q_batch + (size_t)(first_head + slot % heads_per_block) * HEAD_DIM, q_stride,
            query0 + slot / heads_per_block * WARPGROUP_ROWS, T);
    load_block(0);
    copy_async_commit();
    if (blocks > 1)
        load_block(1);
    copy_async_commit();

    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int t = 0; t < HEAD_DIM / 8; t++)
        o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    for (int i = 0; i < blocks; i++) {
        /* block i has landed (block i + 1 may be in flight); every warpgroup is past
         * iteration i - 1, whose products it waited for, so the stage of block i - 1 is free
         * for block i + 2 (possibly nothing: the group count stays uniform) */
        copy_async_wait<1>();
        fence_async_proxy();
        __syncthreads();
        if (i + 2 < blocks)
            load_block(i + 2);
        copy_async_commit();
        if (i < first) /* this block lies wholly past the warpgroup's rows */
            continue;
        const __nv_bfloat16 *k_tile = k_ring + (i % FORWARD_STAGES) * stage_elements;
        const __nv_bfloat16 *v_tile = v_ring + (i % FORWARD_STAGES) * stage_elements;

        /* S_i = Q K_i^T; s is defined before the product reads it (scale-d 0 ignores it) and
         * dies with p below, so it holds no registers while O += P V runs */
        float s[block_keys / 8][4] = {};
        warpgroup_fence();
        warpgroup_rows_times_rows<HEAD_DIM>(s, q_rows, k_tile);
        warpgroup_commit();
        warpgroup_wait<0>();
        warpgroup_fence_accumulators(s);
        if (i == first) {
            /* the diagonal block: mask keys after the row (keys past T are among them) */
            int key0 = (last_block - i) * block_keys;
#pragma unroll
            for (int t = 0; t < block_keys / 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (key0 + t * 8 + 2 * c + (e & 1) > query_row[e >> 1])
                        s[t][e] = -INFINITY;
        }
        float correction[2];
        online_softmax_block<FORWARD_BLOCK_KEYS>(s, row_max, row_sum, correction, scale_log2);
        if (__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) {
#pragma unroll
            for (int t = 0; t < HEAD_DIM / 8; t++) {
                o[t][0] *= correction[0];
                o[t][1] *= correction[0];
                o[t][2] *= correction[1];
                o[t][3] *= correction[1];
            }
        }

        /* O += P_i V_i */
        uint32_t p[4][4]; /* the probabilities as A operands (k = 16j .. 16j+15) */
#pragma unroll
        for (int j = 0; j < block_keys / 16; j++)
            accumulators_to_operand(p[j], s[2 * j], s[2 * j + 1]);
        warpgroup_fence();
        warpgroup_fragments_times_tile<HEAD_DIM>(o, p, v_tile);
        warpgroup_commit();
        warpgroup_wait<0>();
        warpgroup_fence_accumulators(o);
    }
    copy_async_wait<0>(); /* only empty groups remain */

    /* normalise, save lse = ln(sum exp(scaled score)) = ln 2 * (max + log2(sum)) */
    float *lse_base = lse + ((size_t)batch * n_heads + head) * T;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
        for (int t = 0; t < HEAD_DIM / 8; t++) {
            o[t][2 * r] *= inverse;
            o[t][2 * r + 1] *= inverse;
        }
        if (c == 0 && query_row[r] < T)
            lse_base[query_row[r]] = (row_max[r] + log2f(sum)) * LN_2;
    }

    /* out through shared memory, in 16-byte pieces (every product has completed, so the tiles
     * are free once every thread is here) */
    __syncthreads();
    int warp_row0 = group * WARPGROUP_ROWS + warp * 16;
    float *stage = reinterpret_cast<float *>(shared) + warp_row0 * (HEAD_DIM + STAGE_PAD);
    warp_stage_accumulators<HEAD_DIM>(stage, o, 1.0f, lane);
    __syncwarp();
    __nv_bfloat16 *out_base = out + (size_t)batch * T * q_stride + (size_t)head * HEAD_DIM;
    warp_store_staged<HEAD_DIM>(out_base, q_stride, stage, group_row0 + warp * 16, T, false,
                                lane);
}

template <int HEAD_DIM>
static void forward_launch(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                           const __nv_bfloat16 *k, const __nv_bfloat16 *v, int B, int T,
                           int n_heads, int n_kv_heads, cudaStream_t stream)
{
    constexpr size_t shared_bytes = forward_shared_bytes<HEAD_DIM>();
    static bool configured; /* over 48 KiB of shared memory must be asked for, once */
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attention_forward_kernel<HEAD_DIM>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared_bytes));
        configured = true;
    }
    int heads_per_block = forward_heads_per_block(n_heads, n_kv_heads);
    int block_queries = FORWARD_ROWS / heads_per_block;
    dim3 grid(n_heads / heads_per_block, B, (T + block_queries - 1) / block_queries);
    float scale_log2 = LOG2_E / sqrtf((float)HEAD_DIM);
    attention_forward_kernel<HEAD_DIM><<<grid, FORWARD_THREADS, shared_bytes, stream>>>(
        out, lse, q, k, v, T, n_heads, n_kv_heads, heads_per_block, scale_log2);
    CUDA_CHECK_LAUNCH();
}

/* ---- which forward runs ---- */

static int selected_forward = -1; /* -1: not chosen yet, read FATHOM_ATTENTION_FORWARD */

extern "C" void attention_cuda_select_forward(AttentionForwardKernel kernel)
{
    selected_forward = (int)kernel;
}

extern "C" AttentionForwardKernel attention_cuda_forward_kernel(void)
{
    if (selected_forward < 0) {
        /* persistent by default: measured fastest on an H200 at head_dim 64, 80 and 128
         * (docs/performance.md) */
        static const char *const names[] = {"persistent", "specialised", "single_consumer",
                                            "grouped"};
        static const int kernels[] = {ATTENTION_FORWARD_PERSISTENT,
                                      ATTENTION_FORWARD_SPECIALISED,
                                      ATTENTION_FORWARD_SINGLE_CONSUMER,
                                      ATTENTION_FORWARD_GROUPED};
        selected_forward = kernels[env_choice("FATHOM_ATTENTION_FORWARD", names, 4)];
    }
    return (AttentionForwardKernel)selected_forward;
}

extern "C" void attention_forward_cuda(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                       const bf16 *v, int B, int T, int n_heads, int n_kv_heads,
                                       int head_dim, cudaStream_t stream)
{
    const char *op = "attention_forward_cuda";
    attention_check_shape(op, B, T, n_heads, n_kv_heads, head_dim);
    attention_check_aligned(op, "out", out);
    attention_check_aligned(op, "q", q);
    attention_check_aligned(op, "k", k);
    attention_check_aligned(op, "v", v);
    if (B == 0 || T == 0)
        return;
    int block_queries = FORWARD_ROWS / forward_heads_per_block(n_heads, n_kv_heads);
    if ((T + block_queries - 1) / block_queries > 65535)
        fatal(EXIT_CONFIG, "%s: T = %d is longer than the launch grid allows", op, T);
    attention_check_device(op);
    const AttentionForwardKernel kernel = attention_cuda_forward_kernel();
    if (kernel != ATTENTION_FORWARD_GROUPED) {
        attention_forward_specialised_launch(
            out, lse, q, k, v, B, T, n_heads, n_kv_heads, head_dim,
            kernel == ATTENTION_FORWARD_SINGLE_CONSUMER ? 1 : 2,
            kernel == ATTENTION_FORWARD_PERSISTENT, stream);
        return;
    }
    __nv_bfloat16 *out_bf16 = reinterpret_cast<__nv_bfloat16 *>(out);
    const __nv_bfloat16 *q_bf16 = reinterpret_cast<const __nv_bfloat16 *>(q);
    const __nv_bfloat16 *k_bf16 = reinterpret_cast<const __nv_bfloat16 *>(k);
    const __nv_bfloat16 *v_bf16 = reinterpret_cast<const __nv_bfloat16 *>(v);
    switch (head_dim) {
    case 64:
        forward_launch<64>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T, n_heads, n_kv_heads,
                           stream);
        break;
    case 80:
        forward_launch<80>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T, n_heads, n_kv_heads,
                           stream);
        break;
    default:
        forward_launch<128>(out_bf16, lse, q_bf16, k_bf16, v_bf16, B, T, n_heads, n_kv_heads,
                            stream);
        break;
    }
}
