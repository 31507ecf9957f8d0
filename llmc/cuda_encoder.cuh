/*
 The token embedding on the GPU:
     forward:   out[m, :] = wte[tokens[m], :]  (and gather_rows, the same for a few rows of any table)
     backward:  dwte[v, :] += dout[m1, :], then += dout[m2, :], ... for the positions m1 < m2 < ... with
                tokens[m] == v, in increasing m: the CPU reference's order, so the fp32 result is its, bit for bit.
 The backward needs neither atomics nor a sorted index: the first position that holds a token owns that
 token's row of dwte and adds every occurrence itself; the blocks of later positions find an earlier one
 and leave. Each block scans the token ids (which stay in L1/L2), so the cost is O(M^2) integer
 comparisons spread over M blocks, small next to the rows of dout that it reads once.
*/
#ifndef LLMC_CUDA_ENCODER_CUH
#define LLMC_CUDA_ENCODER_CUH

#include "llmc/cuda_common.cuh"

// one thread per 8 columns of one row
__global__ void encoder_forward_kernel(bf16* out, const int* tokens, const bf16* wte, int M, int D) {
    int vecs_per_row = D / 8;
    size_t vec = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec >= (size_t)M * vecs_per_row) { return; }
    int m = (int)(vec / vecs_per_row), col = (int)(vec % vecs_per_row) * 8;
    store_bf16x8(out + (size_t)m * D + col, load_bf16x8(wte + (size_t)tokens[m] * D + col));
}

void encoder_forward(bf16* out, const int* tokens, const bf16* wte, int M, int D) {
    if (D % 8 != 0) { fatal("encoder_forward: D %d must be a multiple of 8 on the GPU", D); }
    const int threads = 256;
    int blocks = (int)(((size_t)M * (D / 8) + threads - 1) / threads);
    encoder_forward_kernel<<<blocks, threads, 0, main_stream>>>(out, tokens, wte, M, D);
    cudaCheck(cudaGetLastError());
}

// out[r] = in[rows[r]] for r < n, the same gather for a few rows of any table
// (each prompt's last row of a prefill): a block per row
__global__ void gather_rows_kernel(bf16* out, const bf16* in, const int* rows, int n, int D) {
    const int r = blockIdx.x;
    for (int d = threadIdx.x * 8; d < D; d += blockDim.x * 8) {
        store_bf16x8(out + (size_t)r * D + d, load_bf16x8(in + (size_t)rows[r] * D + d));
    }
}

void gather_rows(bf16* out, const bf16* in, const int* rows, int n, int D) {
    gather_rows_kernel<<<n, 128, 0, main_stream>>>(out, in, rows, n, D);
    cudaCheck(cudaGetLastError());
}

constexpr int ENCODER_BWD_THREADS = 256;
constexpr int ENCODER_BWD_TOKENS = 4;                                    // token ids each thread checks per chunk
constexpr int ENCODER_BWD_CHUNK = ENCODER_BWD_THREADS * ENCODER_BWD_TOKENS; // positions scanned per step
constexpr int ENCODER_BWD_BATCH = 4;                                     // occurrences whose rows load at once

// Block m: if position m is the first occurrence of its token, adds the rows of dout of all its
// occurrences, in increasing position, to the token's row of dwte. Threads own 8 columns each.
__global__ void __launch_bounds__(ENCODER_BWD_THREADS)
encoder_backward_kernel(float* dwte, const bf16* dout, const int* tokens, int M, int D) {
    // which positions of the current chunk hold the token: word [k][warp], bit lane, is position
    // chunk + k * ENCODER_BWD_THREADS + warp * 32 + lane, so walking k, warp, bit goes in increasing position
    __shared__ unsigned match_bits[ENCODER_BWD_TOKENS][ENCODER_BWD_THREADS / 32];
    const int m = blockIdx.x, token = tokens[m];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

    // a block whose token occurs earlier leaves (the same decision in every thread)
    for (int chunk = 0; chunk < m; chunk += ENCODER_BWD_CHUNK) {
        int earlier = 0;
        for (int k = 0; k < ENCODER_BWD_TOKENS; k++) {
            int j = chunk + k * ENCODER_BWD_THREADS + threadIdx.x;
            earlier |= j < m && tokens[j] == token;
        }
        if (__syncthreads_or(earlier)) { return; }
    }

    float* row = dwte + (size_t)token * D;
    for (int col0 = 0; col0 < D; col0 += ENCODER_BWD_THREADS * 8) {
        const int col = col0 + threadIdx.x * 8;
        const bool has_col = col < D;
        float acc[8];
        if (has_col) {
            float4 lo = *reinterpret_cast<const float4*>(row + col);
            float4 hi = *reinterpret_cast<const float4*>(row + col + 4);
            acc[0] = lo.x; acc[1] = lo.y; acc[2] = lo.z; acc[3] = lo.w;
            acc[4] = hi.x; acc[5] = hi.y; acc[6] = hi.z; acc[7] = hi.w;
        }
        for (int chunk = m; chunk < M; chunk += ENCODER_BWD_CHUNK) {
            for (int k = 0; k < ENCODER_BWD_TOKENS; k++) {
                int j = chunk + k * ENCODER_BWD_THREADS + threadIdx.x;
                unsigned bits = __ballot_sync(0xffffffffu, j < M && tokens[j] == token);
                if (lane == 0) { match_bits[k][warp] = bits; }
            }
            __syncthreads();
            for (int k = 0; k < ENCODER_BWD_TOKENS; k++) {
                for (int w = 0; w < ENCODER_BWD_THREADS / 32; w++) {
                    unsigned bits = match_bits[k][w];
                    const int first = chunk + k * ENCODER_BWD_THREADS + w * 32;
                    while (bits) {
                        // the next few occurrences: their loads go out together, the adds stay in order
                        int pos[ENCODER_BWD_BATCH];
                        #pragma unroll
                        for (int b = 0; b < ENCODER_BWD_BATCH; b++) {
                            pos[b] = bits ? first + __ffs(bits) - 1 : -1;
                            bits &= bits - 1;
                        }
                        Bf16x8 d[ENCODER_BWD_BATCH];
                        #pragma unroll
                        for (int b = 0; b < ENCODER_BWD_BATCH; b++) {
                            if (has_col && pos[b] >= 0) { d[b] = load_bf16x8(dout + (size_t)pos[b] * D + col); }
                        }
                        #pragma unroll
                        for (int b = 0; b < ENCODER_BWD_BATCH; b++) {
                            if (has_col && pos[b] >= 0) {
                                #pragma unroll
                                for (int i = 0; i < 8; i++) { acc[i] += __bfloat162float(d[b].v[i]); }
                            }
                        }
                    }
                }
            }
            __syncthreads(); // match_bits is read by all before the next chunk overwrites it
        }
        if (has_col) {
            *reinterpret_cast<float4*>(row + col) = make_float4(acc[0], acc[1], acc[2], acc[3]);
            *reinterpret_cast<float4*>(row + col + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
        }
    }
}

void encoder_backward(float* dwte, const bf16* dout, const int* tokens, int M, int D) {
    if (D % 8 != 0) { fatal("encoder_backward: D %d must be a multiple of 8 on the GPU", D); }
    encoder_backward_kernel<<<M, ENCODER_BWD_THREADS, 0, main_stream>>>(dwte, dout, tokens, M, D);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_CUDA_ENCODER_CUH
