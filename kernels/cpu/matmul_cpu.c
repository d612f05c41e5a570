/* kernels/cpu/matmul_cpu.c — out = in @ weight^T and its backward (runtime/backend.h).
 *
 * in [rows, in_dim], weight [out_dim, in_dim] (the Hugging Face Linear layout),
 * out [rows, out_dim].
 *
 * Forward: every output element is one dot product over in_dim, both operands contiguous.
 * The dot is split into MATMUL_LANES interleaved partial sums (lane l takes i = l mod LANES),
 * combined in a fixed order, then the tail i >= in_dim - in_dim % LANES is added in order:
 * the lanes let the compiler use vector registers without reassociating anything, and the
 * one fixed expression makes a row's result independent of the thread count and of the
 * other rows in the batch. A register tile of MATMUL_TILE_ROWS x MATMUL_TILE_OUTS dots shares
 * its loads; blocks of MATMUL_BLOCK rows x outs keep the operands in cache and are the unit
 * of work of a thread.
 *
 * Backward: both gradients are sums of outer-product rows,
 *   din[r, :]     += sum over o, in order, of dout[r, o] * weight[o, :]   (or =, GRAD_WRITE)
 *   dweight[o, :] += sum over r, in order, of dout[r, o] * in[r, :]
 * computed by one routine (accumulate_rows) that splits the output into blocks, one thread
 * a block, and streams the sum index in order: deterministic, and the inner loop is a
 * contiguous axpy that vectorises. GRAD_WRITE starts a block's sums from +0.0 instead of
 * the old contents (the bits of an add into zeros, kernels_cpu.h).
 */
#include "kernels/cpu/kernels_cpu.h"

enum {
    MATMUL_LANES = 4,      /* partial sums per dot; combine_lanes below is written for 4 */
    MATMUL_TILE_ROWS = 2,  /* register tile: dots computed together */
    MATMUL_TILE_OUTS = 4,
    MATMUL_BLOCK = 64,     /* rows and outs per thread block (64 x in_dim floats each) */
    ACCUMULATE_BLOCK_ROWS = 8,     /* accumulate_rows: output rows per block */
    ACCUMULATE_BLOCK_COLUMNS = 256 /* accumulate_rows: output columns per block */
};

static inline float combine_lanes(const float lanes[MATMUL_LANES])
{
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

/* One dot product in the fixed lane order; used where a full register tile does not fit. */
static float dot_in_lane_order(const float *a, const float *b, int n)
{
    float lanes[MATMUL_LANES] = {0};
    int i = 0;
    for (; i + MATMUL_LANES <= n; i += MATMUL_LANES)
        for (int l = 0; l < MATMUL_LANES; l++)
            lanes[l] += a[i + l] * b[i + l];
    float sum = combine_lanes(lanes);
    for (; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

/* out[r, o] for a full MATMUL_TILE_ROWS x MATMUL_TILE_OUTS tile, in the same lane order as
 * dot_in_lane_order. in, weight and out point at the tile's first row / out. */
static void dot_tile(float *out, int out_dim, const float *in, const float *weight, int in_dim)
{
    float lanes[MATMUL_TILE_ROWS][MATMUL_TILE_OUTS][MATMUL_LANES] = {{{0}}};
    int i = 0;
    for (; i + MATMUL_LANES <= in_dim; i += MATMUL_LANES)
        for (int r = 0; r < MATMUL_TILE_ROWS; r++)
            for (int o = 0; o < MATMUL_TILE_OUTS; o++)
                for (int l = 0; l < MATMUL_LANES; l++)
                    lanes[r][o][l] += in[(size_t)r * in_dim + i + l] *
                                      weight[(size_t)o * in_dim + i + l];
    for (int r = 0; r < MATMUL_TILE_ROWS; r++)
        for (int o = 0; o < MATMUL_TILE_OUTS; o++) {
            float sum = combine_lanes(lanes[r][o]);
            for (int j = i; j < in_dim; j++)
                sum += in[(size_t)r * in_dim + j] * weight[(size_t)o * in_dim + j];
            out[(size_t)r * out_dim + o] = sum;
        }
}

void cpu_matmul_forward(float *out, const float *in, const float *weight, int rows, int in_dim,
                        int out_dim)
{
    int row_blocks = (rows + MATMUL_BLOCK - 1) / MATMUL_BLOCK;
    int out_blocks = (out_dim + MATMUL_BLOCK - 1) / MATMUL_BLOCK;
    size_t work = (size_t)rows * in_dim * out_dim;
#pragma omp parallel for collapse(2) schedule(static) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int out_block = 0; out_block < out_blocks; out_block++)
        for (int row_block = 0; row_block < row_blocks; row_block++) {
            int r0 = row_block * MATMUL_BLOCK, o0 = out_block * MATMUL_BLOCK;
            int r_end = r0 + MATMUL_BLOCK < rows ? r0 + MATMUL_BLOCK : rows;
            int o_end = o0 + MATMUL_BLOCK < out_dim ? o0 + MATMUL_BLOCK : out_dim;
            int r = r0;
            for (; r + MATMUL_TILE_ROWS <= r_end; r += MATMUL_TILE_ROWS) {
                int o = o0;
                for (; o + MATMUL_TILE_OUTS <= o_end; o += MATMUL_TILE_OUTS)
                    dot_tile(out + (size_t)r * out_dim + o, out_dim, in + (size_t)r * in_dim,
                             weight + (size_t)o * in_dim, in_dim);
                for (; o < o_end; o++)
                    for (int rr = r; rr < r + MATMUL_TILE_ROWS; rr++)
                        out[(size_t)rr * out_dim + o] = dot_in_lane_order(
                            in + (size_t)rr * in_dim, weight + (size_t)o * in_dim, in_dim);
            }
            for (; r < r_end; r++)
                for (int o = o0; o < o_end; o++)
                    out[(size_t)r * out_dim + o] = dot_in_lane_order(
                        in + (size_t)r * in_dim, weight + (size_t)o * in_dim, in_dim);
        }
}

/* target[m, n] += sum over k < K, in order, of coefficient(k, m) * source[k, n], onto the
 * old target (accumulate) or onto +0.0 (the old target is not read)
 * target [M, N] (row stride N), source [K, N] (row stride N), and
 * coefficient(k, m) = coefficients[k * k_stride + m * m_stride]. */
static void accumulate_rows(float *target, bool accumulate, const float *source,
                            const float *coefficients, size_t k_stride, size_t m_stride, int M,
                            int N, int K)
{
    int row_blocks = (M + ACCUMULATE_BLOCK_ROWS - 1) / ACCUMULATE_BLOCK_ROWS;
    int column_blocks = (N + ACCUMULATE_BLOCK_COLUMNS - 1) / ACCUMULATE_BLOCK_COLUMNS;
    size_t work = (size_t)M * N * K;
#pragma omp parallel for collapse(2) schedule(static) if (work >= CPU_PARALLEL_MIN_WORK)
    for (int row_block = 0; row_block < row_blocks; row_block++)
        for (int column_block = 0; column_block < column_blocks; column_block++) {
            int m0 = row_block * ACCUMULATE_BLOCK_ROWS;
            int m_end = m0 + ACCUMULATE_BLOCK_ROWS < M ? m0 + ACCUMULATE_BLOCK_ROWS : M;
            int n0 = column_block * ACCUMULATE_BLOCK_COLUMNS;
            int n_end = n0 + ACCUMULATE_BLOCK_COLUMNS < N ? n0 + ACCUMULATE_BLOCK_COLUMNS : N;
            if (!accumulate) /* the block's own part of target, in cache for the sums below */
                for (int m = m0; m < m_end; m++)
                    for (int n = n0; n < n_end; n++)
                        target[(size_t)m * N + n] = 0.0f;
            for (int k = 0; k < K; k++) {
                const float *source_row = source + (size_t)k * N;
                for (int m = m0; m < m_end; m++) {
                    float coefficient = coefficients[(size_t)k * k_stride + (size_t)m * m_stride];
                    float *target_row = target + (size_t)m * N;
                    for (int n = n0; n < n_end; n++)
                        target_row[n] += coefficient * source_row[n];
                }
            }
        }
}

void cpu_matmul_backward(float *din, GradMode din_mode, float *dweight, GradMode dweight_mode,
                         const float *dout, const float *in, const float *weight, int rows,
                         int in_dim, int out_dim)
{
    /* din[r, i] (+)= sum_o dout[r, o] * weight[o, i]: k = o, m = r */
    if (din)
        accumulate_rows(din, din_mode == GRAD_ADD, weight, dout, 1, (size_t)out_dim, rows,
                        in_dim, out_dim);
    /* dweight[o, i] (+)= sum_r dout[r, o] * in[r, i]: k = r, m = o */
    accumulate_rows(dweight, dweight_mode == GRAD_ADD, in, dout, (size_t)out_dim, 1, out_dim,
                    in_dim, rows);
}
