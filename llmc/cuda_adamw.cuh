/*
 The optimizer step on the GPU: fp32 master weights, fp32 moments, fp32 gradients, bf16 weights for compute.
     global_norm_squared_cuda:  out[0] = sum_i grads[i]^2
     adamw_update_cuda:         norm = sqrt(out[0]),  s = grad_clip / norm if grad_clip > 0 and norm > grad_clip,
                                else 1 (computed on the device: no host sync);  g = s * grad
                                m = b1 m + (1-b1) g,  v = b2 v + (1-b2) g^2
                                master -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * master )
                                params = bf16(master), rounded to nearest
                                all unchanged when the norm or the step's summed loss is not finite
     permute_rows_cuda:         out[r] = in[perm[r]] (a new order of a layer's FFN units, llmc/optimizer.h)
 The same math as llmc/adamw.h. The norm is a two-stage sum in a fixed order (a fixed grid of block
 partials, then one block), so it is the same on every run.
*/
#ifndef LLMC_CUDA_ADAMW_CUH
#define LLMC_CUDA_ADAMW_CUH

#include <stdint.h>
#include "llmc/cuda_common.cuh"

// the first stage's grid: a fixed size, so the order of the sum does not depend on the GPU;
// global_norm_squared_cuda's scratch holds this many floats
constexpr int GLOBAL_NORM_BLOCKS = 1024;
constexpr int GLOBAL_NORM_THREADS = 256;

// partial[b] = the sum of squares of the elements that block b's threads visit (grid-stride, 4 at a
// time), summed in double and stored as fp32
__global__ void __launch_bounds__(GLOBAL_NORM_THREADS)
norm_squared_partial_kernel(float* partial, const float* grads, size_t n) {
    const size_t stride = (size_t)GLOBAL_NORM_BLOCKS * GLOBAL_NORM_THREADS;
    const size_t first = (size_t)blockIdx.x * GLOBAL_NORM_THREADS + threadIdx.x;
    double sum = 0.0;
    const size_t n4 = n / 4;
    #pragma unroll 4
    for (size_t i = first; i < n4; i += stride) {
        float4 g = reinterpret_cast<const float4*>(grads)[i];
        sum += (double)g.x * g.x + (double)g.y * g.y + (double)g.z * g.z + (double)g.w * g.w;
    }
    for (size_t i = 4 * n4 + first; i < n; i += stride) { sum += (double)grads[i] * grads[i]; } // the last n % 4
    sum = block_reduce<Sum>(sum);
    if (threadIdx.x == 0) { partial[blockIdx.x] = (float)sum; }
}

__global__ void __launch_bounds__(GLOBAL_NORM_BLOCKS)
norm_squared_final_kernel(float* out, const float* partial) {
    double sum = block_reduce<Sum>((double)partial[threadIdx.x]);
    if (threadIdx.x == 0) { out[0] = (float)sum; }
}

// grads 16-byte aligned; scratch: GLOBAL_NORM_BLOCKS floats
void global_norm_squared_cuda(float* out, const float* grads, size_t n, float* scratch) {
    if ((uintptr_t)grads % 16 != 0) { fatal("global_norm_squared_cuda: grads must be 16-byte aligned"); }
    norm_squared_partial_kernel<<<GLOBAL_NORM_BLOCKS, GLOBAL_NORM_THREADS, 0, main_stream>>>(scratch, grads, n);
    cudaCheck(cudaGetLastError());
    norm_squared_final_kernel<<<1, GLOBAL_NORM_BLOCKS, 0, main_stream>>>(out, scratch);
    cudaCheck(cudaGetLastError());
}

constexpr int ADAMW_THREADS = 256;
constexpr int ADAMW_PER_THREAD = 4; // parameters per thread: their 16 loads go out together

// A block updates ADAMW_THREADS * ADAMW_PER_THREAD consecutive parameters; thread t takes every
// ADAMW_THREADS-th one from its block's start + t: 32-bit accesses, each coalesced across the warp, with
// no alignment required of any tensor. Seven fp32 streams and one bf16 stream, 30 bytes per parameter.
// The arrays never overlap (__restrict__), so the loads of all k can go out before the first store.
__global__ void __launch_bounds__(ADAMW_THREADS)
adamw_kernel(float* __restrict__ master, bf16* __restrict__ params, const float* __restrict__ grads,
             float* __restrict__ m, float* __restrict__ v, size_t n, float lr, float beta1, float beta2,
             float b1_correction, float b2_correction, float eps, float weight_decay, const float* grad_norm_sq,
             float grad_clip, const double* loss) {
    // a NaN or inf in the loss or any gradient: the step is skipped, weights and moments stay as they are
    if (!isfinite(*grad_norm_sq) || (loss != NULL && !isfinite(*loss))) { return; }
    const float norm = sqrtf(*grad_norm_sq);
    const float scale = grad_clip > 0.0f && norm > grad_clip ? grad_clip / norm : 1.0f;
    const size_t first = (size_t)blockIdx.x * ADAMW_THREADS * ADAMW_PER_THREAD + threadIdx.x;
    #pragma unroll
    for (int k = 0; k < ADAMW_PER_THREAD; k++) {
        const size_t i = first + (size_t)k * ADAMW_THREADS;
        if (i < n) {
            const float g = grads[i] * scale;
            const float mi = beta1 * m[i] + (1.0f - beta1) * g;
            const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
            m[i] = mi;
            v[i] = vi;
            const float m_hat = mi / b1_correction, v_hat = vi / b2_correction;
            const float p = master[i];
            const float updated = p - lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * p);
            master[i] = updated;
            params[i] = __float2bfloat16_rn(updated);
        }
    }
}

// t is the 1-based step; weight_decay is 0 for the tensors that take none (norm weights); loss: the
// step's summed loss on the device, or NULL
void adamw_update_cuda(float* master, bf16* params, const float* grads, float* m, float* v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t, const float* grad_norm_sq,
                       float grad_clip, const double* loss) {
    const float b1_correction = 1.0f - powf(beta1, (float)t);
    const float b2_correction = 1.0f - powf(beta2, (float)t);
    const size_t per_block = (size_t)ADAMW_THREADS * ADAMW_PER_THREAD;
    adamw_kernel<<<(unsigned)((n + per_block - 1) / per_block), ADAMW_THREADS, 0, main_stream>>>(
        master, params, grads, m, v, n, lr, beta1, beta2, b1_correction, b2_correction, eps, weight_decay,
        grad_norm_sq, grad_clip, loss);
    cudaCheck(cudaGetLastError());
}

// out[r] = in[perm[r]], rows of D elements (out and in distinct): a new order of a layer's units in the
// weights and in the optimizer state (llmc/optimizer.h); a block per row, 16 bytes per thread when rows allow
template <typename T>
__global__ void permute_rows_kernel(T* out, const T* in, const int* perm, int D) {
    const size_t row_bytes = (size_t)D * sizeof(T);
    const char* src = (const char*)(in) + (size_t)perm[blockIdx.x] * row_bytes;
    char* dst = (char*)(out) + (size_t)blockIdx.x * row_bytes;
    if (row_bytes % 16 == 0 && (uintptr_t)src % 16 == 0 && (uintptr_t)dst % 16 == 0) {
        for (size_t i = threadIdx.x * 16; i < row_bytes; i += blockDim.x * 16) {
            *reinterpret_cast<int4*>(dst + i) = *reinterpret_cast<const int4*>(src + i);
        }
    } else {
        for (size_t i = threadIdx.x; i < row_bytes; i += blockDim.x) { dst[i] = src[i]; }
    }
}

// perm on the device
template <typename T>
void permute_rows_cuda(T* out, const T* in, const int* perm, int rows, int D) {
    permute_rows_kernel<T><<<rows, 256, 0, main_stream>>>(out, in, perm, D);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_CUDA_ADAMW_CUH
