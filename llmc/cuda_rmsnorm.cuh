/*
 RMSNorm on the GPU, over rows of D (bf16 in and out, fp32 math and statistics):
     forward:   rstd = 1 / sqrt(mean(x^2) + eps),  out = x * rstd * w
     fused:     x_out = bf16(x + y),  norm_out = RMSNorm(x_out as stored)
     apply:     out = x * rstd * w with a forward's rstd (its out again, to the bit)
     backward:  n = x * rstd,  dinp += rstd * (dout*w - n * mean(dout*w*n)),  dw += sum_m dout * n
 Forward: a block per row (a warp per row when D > 8192). Backward: a warp per row; the weight
 gradient is a sum over rows: each block writes the partial sum of its rows to scratch, and a second
 kernel adds the partials in block order, so the result is the same on every run.
*/
#ifndef LLMC_CUDA_RMSNORM_CUH
#define LLMC_CUDA_RMSNORM_CUH

#include "llmc/cuda_common.cuh"

constexpr int RMSNORM_THREADS = 256; // 8 warps, 8 rows per block

// the row as the norm sees it: x, or with y, bf16(x + y), the value stored in x_out (computed again in
// the second pass rather than read back: reading memory this kernel writes would forbid the read-only
// cache path for the inputs)
__device__ __forceinline__ Bf16x8 rmsnorm_row_input(const bf16* __restrict__ x, const bf16* __restrict__ y,
                                                   size_t offset) {
    Bf16x8 a = load_bf16x8(x + offset);
    if (y) {
        Bf16x8 b = load_bf16x8(y + offset);
        for (int i = 0; i < 8; i++) {
            a.v[i] = __float2bfloat16_rn(__bfloat162float(a.v[i]) + __bfloat162float(b.v[i]));
        }
    }
    return a;
}

// out = bf16(x * r * w) for 8 columns: every kernel here rounds the norm's output by this one expression
__device__ __forceinline__ Bf16x8 rmsnorm_scale(const Bf16x8& a, float r, const Bf16x8& w) {
    Bf16x8 o;
    for (int i = 0; i < 8; i++) { o.v[i] = __float2bfloat16_rn(__bfloat162float(a.v[i]) * r * __bfloat162float(w.v[i])); }
    return o;
}

// a block per row, a thread per 8 columns, the row kept in registers: one read
// of x (and y), and a decode step's single row spread over a whole block. The
// weights are read before the wait of an early launch (cuda_common.cuh).
constexpr int RMSNORM_ROW_MAX_THREADS = 1024;

__global__ void rmsnorm_forward_kernel(bf16* __restrict__ out, float* __restrict__ rstd, bf16* __restrict__ x_out,
                                       const bf16* __restrict__ x, const bf16* __restrict__ y,
                                       const bf16* __restrict__ w, int D, float eps) {
    const size_t row = (size_t)blockIdx.x * D;
    const int col = threadIdx.x * 8;
    Bf16x8 a, wv;
    if (col < D) { wv = load_bf16x8(w + col); }
    grid_dependents_launch();
    grid_dependency_wait();
    float sum_sq = 0.0f;
    if (col < D) {
        a = rmsnorm_row_input(x, y, row + col);
        if (y) { store_bf16x8(x_out + row + col, a); }
        for (int i = 0; i < 8; i++) { float v = __bfloat162float(a.v[i]); sum_sq += v * v; }
    }
    sum_sq = block_reduce<Sum>(sum_sq);
    const float r = 1.0f / sqrtf(sum_sq / D + eps);
    if (col < D) { store_bf16x8(out + row + col, rmsnorm_scale(a, r, wv)); }
    if (rstd && threadIdx.x == 0) { rstd[blockIdx.x] = r; }
}

// rows wider than a block's 8 x 1024 columns: a warp per row, two passes over it
__global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_forward_wide_kernel(bf16* __restrict__ out, float* __restrict__ rstd, bf16* __restrict__ x_out,
                            const bf16* __restrict__ x, const bf16* __restrict__ y, const bf16* __restrict__ w,
                            int M, int D, float eps) {
    const int lane = threadIdx.x % 32;
    const int m = blockIdx.x * (RMSNORM_THREADS / 32) + threadIdx.x / 32;
    if (m >= M) { return; }
    const size_t row = (size_t)m * D;
    float sum_sq = 0.0f;
    #pragma unroll 4
    for (int col = lane * 8; col < D; col += 32 * 8) {
        Bf16x8 a = rmsnorm_row_input(x, y, row + col);
        if (y) { store_bf16x8(x_out + row + col, a); }
        for (int i = 0; i < 8; i++) { float v = __bfloat162float(a.v[i]); sum_sq += v * v; }
    }
    sum_sq = warp_reduce<Sum>(sum_sq);
    const float r = 1.0f / sqrtf(sum_sq / D + eps);
    #pragma unroll 4
    for (int col = lane * 8; col < D; col += 32 * 8) {
        Bf16x8 a = rmsnorm_row_input(x, y, row + col), wv = load_bf16x8(w + col);
        store_bf16x8(out + row + col, rmsnorm_scale(a, r, wv));
    }
    if (rstd && lane == 0) { rstd[m] = r; }
}

// out = x * rstd * w, a thread per 8 columns of a row
__global__ void rmsnorm_apply_kernel(bf16* __restrict__ out, const bf16* __restrict__ x, const float* __restrict__ rstd,
                                     const bf16* __restrict__ w, int M, int D) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= (size_t)M * D) { return; }
    const int col = (int)(i % D);
    store_bf16x8(out + i, rmsnorm_scale(load_bf16x8(x + i), rstd[i / D], load_bf16x8(w + col)));
}

static void rmsnorm_launch(bf16* out, float* rstd, bf16* x_out, const bf16* x, const bf16* y, const bf16* w,
                           int M, int D, float eps, bool early) {
    if (D % 8 != 0) { fatal("rmsnorm: D %d must be a multiple of 8 on the GPU", D); }
    const int threads = ceil_div(D / 8, 32) * 32;
    if (threads <= RMSNORM_ROW_MAX_THREADS && early) {
        launch_early(rmsnorm_forward_kernel, M, threads, 0, out, rstd, x_out, x, y, w, D, eps);
    } else if (threads <= RMSNORM_ROW_MAX_THREADS) {
        rmsnorm_forward_kernel<<<M, threads, 0, main_stream>>>(out, rstd, x_out, x, y, w, D, eps);
    } else {
        rmsnorm_forward_wide_kernel<<<ceil_div(M, RMSNORM_THREADS / 32), RMSNORM_THREADS, 0, main_stream>>>(
            out, rstd, x_out, x, y, w, M, D, eps);
    }
    cudaCheck(cudaGetLastError());
}

// rstd may be NULL; out must not overlap the inputs. early: launch_early (for
// inference's decode: no kernel there writes w; training's norms may follow
// waits on other streams, which an early launch would not be ordered after)
void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* w, int M, int D, float eps,
                     bool early = false) {
    rmsnorm_launch(out, rstd, NULL, inp, NULL, w, M, D, eps, early);
}

// out = inp * rstd * w with the rstd of an earlier rmsnorm_forward of inp: that forward's out again, to the bit
void rmsnorm_apply(bf16* out, const bf16* inp, const float* rstd, const bf16* w, int M, int D) {
    if (D % 8 != 0) { fatal("rmsnorm: D %d must be a multiple of 8 on the GPU", D); }
    const size_t n8 = (size_t)M * D / 8;
    rmsnorm_apply_kernel<<<(unsigned int)((n8 + 255) / 256), 256, 0, main_stream>>>(out, inp, rstd, w, M, D);
    cudaCheck(cudaGetLastError());
}

// x_out and norm_out must not overlap the inputs
void fused_residual_rmsnorm_forward(bf16* x_out, bf16* norm_out, float* rstd, const bf16* x, const bf16* y,
                                    const bf16* w, int M, int D, float eps, bool early = false) {
    rmsnorm_launch(norm_out, rstd, x_out, x, y, w, M, D, eps, early);
}

// the backward's rows per block: at least 32, and at most 1024 blocks (the size of scratch)
static inline int rmsnorm_backward_rows_per_block(int M) { return ceil_div(M, 1024) > 32 ? ceil_div(M, 1024) : 32; }

// Block b owns rows [b R, b R + R). A warp per row adds to dinp; then a thread per 8 columns sums
// dout * n over the block's rows, in row order, into dw_partial[b, :].
__global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_backward_kernel(bf16* __restrict__ dinp, float* __restrict__ dw_partial, const bf16* __restrict__ dout,
                        const bf16* __restrict__ inp, const bf16* __restrict__ w, const float* __restrict__ rstd,
                        int M, int D, int rows_per_block) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int row0 = blockIdx.x * rows_per_block;
    const int row_end = row0 + rows_per_block < M ? row0 + rows_per_block : M;

    for (int m = row0 + warp; m < row_end; m += RMSNORM_THREADS / 32) {
        const size_t row = (size_t)m * D;
        const float r = rstd[m];
        float dot = 0.0f; // sum of dout * w * x
        #pragma unroll 4
        for (int col = lane * 8; col < D; col += 32 * 8) {
            Bf16x8 dy = load_bf16x8(dout + row + col), x = load_bf16x8(inp + row + col), wv = load_bf16x8(w + col);
            for (int i = 0; i < 8; i++) {
                dot += __bfloat162float(dy.v[i]) * __bfloat162float(wv.v[i]) * __bfloat162float(x.v[i]);
            }
        }
        const float proj = warp_reduce<Sum>(dot) * r / D; // mean(dout * w * n)
        #pragma unroll 4
        for (int col = lane * 8; col < D; col += 32 * 8) {
            Bf16x8 dy = load_bf16x8(dout + row + col), x = load_bf16x8(inp + row + col), wv = load_bf16x8(w + col);
            Bf16x8 dx = load_bf16x8(dinp + row + col);
            for (int i = 0; i < 8; i++) {
                float n = __bfloat162float(x.v[i]) * r;
                float g = r * (__bfloat162float(dy.v[i]) * __bfloat162float(wv.v[i]) - n * proj);
                dx.v[i] = __float2bfloat16_rn(__bfloat162float(dx.v[i]) + g);
            }
            store_bf16x8(dinp + row + col, dx);
        }
    }

    // the rows were just read by this block: these second reads mostly hit the caches
    for (int col = threadIdx.x * 8; col < D; col += RMSNORM_THREADS * 8) {
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        #pragma unroll 4
        for (int m = row0; m < row_end; m++) {
            const float r = rstd[m];
            Bf16x8 dy = load_bf16x8(dout + (size_t)m * D + col), x = load_bf16x8(inp + (size_t)m * D + col);
            for (int i = 0; i < 8; i++) { acc[i] += __bfloat162float(dy.v[i]) * (__bfloat162float(x.v[i]) * r); }
        }
        float* out = dw_partial + (size_t)blockIdx.x * D + col;
        *reinterpret_cast<float4*>(out) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        *reinterpret_cast<float4*>(out + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
}

// dw[c] += sum over b of dw_partial[b, c]: lane = column, warp y sums the partials b = y, y + 8, ...,
// then warp 0 adds the 8 warp sums in order
__global__ void rmsnorm_dw_kernel(float* dw, const float* dw_partial, int num_partials, int D) {
    __shared__ float warp_sums[8][32];
    const int col = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (col < D) {
        #pragma unroll 8
        for (int b = threadIdx.y; b < num_partials; b += 8) { sum += dw_partial[(size_t)b * D + col]; }
    }
    warp_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < D) {
        float total = 0.0f;
        for (int y = 0; y < 8; y++) { total += warp_sums[y][threadIdx.x]; }
        dw[col] += total;
    }
}

// dinp and dw accumulate (dinp must not overlap dout or inp); scratch holds the per-block partial sums of dw:
// ceil(M / rows_per_block) * D <= 1024 * D floats
void rmsnorm_backward(bf16* dinp, float* dw, float* scratch, const bf16* dout, const bf16* inp, const bf16* w,
                      const float* rstd, int M, int D) {
    if (D % 8 != 0) { fatal("rmsnorm_backward: D %d must be a multiple of 8 on the GPU", D); }
    const int rows_per_block = rmsnorm_backward_rows_per_block(M);
    const int blocks = ceil_div(M, rows_per_block);
    rmsnorm_backward_kernel<<<blocks, RMSNORM_THREADS, 0, main_stream>>>(dinp, scratch, dout, inp, w, rstd, M, D,
                                                                         rows_per_block);
    cudaCheck(cudaGetLastError());
    rmsnorm_dw_kernel<<<ceil_div(D, 32), dim3(32, 8), 0, main_stream>>>(dw, scratch, blocks, D);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_CUDA_RMSNORM_CUH
