/*
 The classifier's loss on the GPU, and the per-step sums of the forward's statistics.
     per row m of Vp logits z (only the first V are real tokens):
         lse = log sum_{i<V} exp(z_i),  losses[m] = lse - z[target],
         dlogits[i] = (exp(z_i - lse) - [i == target]) * dloss for i < V, 0 for V <= i < Vp
     forward_stats_accumulate_cuda: acc[0] += sum_m losses; per layer l: acc[1 + 3l] += sum_m row_l1,
         acc[2 + 3l] += sum_m row_active, acc[3 + 3l] = max(acc[3 + 3l], max_m row_active)
 The cross-entropy reads each row once: a block holds up to 64K logits of its row in registers while it
 finds the maximum and the sum of exponentials (online over tiles: the sum is rescaled when a tile
 raises the maximum), then writes dlogits from the registers. A longer row streams through in tiles of 64K and reads
 all but its last tile a second time (from L2, mostly).
     greedy_kernel: best[m] = min { i < V : z_i = max_{j<V} z_j }, or -1 where some z_i (i < V) is not
         finite: greedy decoding's token without the logits' trip to the host (logits_greedy, llmc/sampler.h)
*/
#ifndef LLMC_CUDA_CLASSIFIER_CUH
#define LLMC_CUDA_CLASSIFIER_CUH

#include <math.h>
#include "llmc/cuda_common.cuh"

// a logit and its index as one key whose maximum is the largest logit at its first index (-0 taken as 0, as
// the host's comparison takes it)
__device__ __forceinline__ unsigned long long greedy_key(float z, int i) {
    uint32_t bits = __float_as_uint(z == 0.0f ? 0.0f : z);
    uint32_t ordered = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
    return (unsigned long long)ordered << 32 | (0xffffffffu - (uint32_t)i);
}

// a block per row of Vp logits
__global__ void greedy_kernel(int* best, const bf16* logits, int V, int Vp) {
    const bf16* row = logits + (size_t)blockIdx.x * Vp;
    unsigned long long key = 0;
    int bad = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float z = __bfloat162float(row[i]);
        bad |= !isfinite(z);
        key = max(key, greedy_key(z, i));
    }
    key = block_reduce<Max>(key);
    bad = block_reduce<Max>(bad);
    if (threadIdx.x == 0) { best[blockIdx.x] = bad ? -1 : (int)(0xffffffffu - (uint32_t)key); }
}

constexpr int CE_THREADS = 1024;
constexpr int CE_VECS = 8;                            // 8-logit vectors per thread in a tile
constexpr int CE_TILE = CE_THREADS * CE_VECS * 8;     // logits per tile

// (max, sum) of two parts of a softmax denominator, sum relative to max; symmetric, so the butterfly
// gives every lane the same bits. A part with no logits is (-inf, 0).
__device__ __forceinline__ void softmax_combine(float& max_a, float& sum_a, float max_b, float sum_b) {
    float max_ab = fmaxf(max_a, max_b);
    sum_a = (max_a == max_ab ? sum_a : sum_a * expf(max_a - max_ab)) +
            (max_b == max_ab ? sum_b : sum_b * expf(max_b - max_ab));
    max_a = max_ab;
}

// Loads this thread's vectors of a tile: vector k starts at logit tile * CE_TILE + (k * CE_THREADS + t) * 8.
// Logits past V (padding, or past the row) come back as -inf: they then drop out of the max and the sum,
// and their dlogits come out 0, with no masks in the loops.
__device__ __forceinline__ void crossentropy_load_tile(Bf16x8 (&cache)[CE_VECS], const bf16* z, int tile, int V) {
    #pragma unroll
    for (int k = 0; k < CE_VECS; k++) {
        const int i0 = tile * CE_TILE + (k * CE_THREADS + threadIdx.x) * 8;
        if (i0 < V) { cache[k] = load_bf16x8(z + i0); }
        if (i0 + 8 > V) {
            #pragma unroll
            for (int i = 0; i < 8; i++) {
                if (i0 + i >= V) { cache[k].v[i] = __float2bfloat16(-INFINITY); }
            }
        }
    }
}

// one block per row
__global__ void __launch_bounds__(CE_THREADS, 1)
crossentropy_kernel(bf16* dlogits, float* losses, const bf16* logits, const int* targets, int V, int Vp,
                    float dloss) {
    __shared__ float part_max[CE_THREADS / 32], part_sum[CE_THREADS / 32];
    __shared__ float row_lse;
    const int m = blockIdx.x, target = targets[m];
    const bf16* z = logits + (size_t)m * Vp;
    // read before any thread writes the row: dlogits may be the logits
    const float z_target = threadIdx.x == 0 ? __bfloat162float(z[target]) : 0.0f;
    const int num_tiles = (Vp + CE_TILE - 1) / CE_TILE;

    // this thread's (max, sum of exp(z - max)), one rescale per tile
    Bf16x8 cache[CE_VECS];
    float run_max = -INFINITY, run_sum = 0.0f;
    for (int tile = 0; tile < num_tiles; tile++) {
        crossentropy_load_tile(cache, z, tile, V);
        // the max on packed pairs: unpacking the whole tile to fp32 here would not fit in the registers
        __nv_bfloat162 pair_max = __float2bfloat162_rn(-INFINITY);
        #pragma unroll
        for (int k = 0; k < CE_VECS; k++) {
            const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(cache[k].v);
            #pragma unroll
            for (int i = 0; i < 4; i++) { pair_max = __hmax2(pair_max, pairs[i]); }
        }
        const float new_max = fmaxf(run_max, fmaxf(__low2float(pair_max), __high2float(pair_max)));
        if (new_max == -INFINITY) { continue; } // no real logit yet
        run_sum *= expf(run_max - new_max);
        run_max = new_max;
        #pragma unroll
        for (int k = 0; k < CE_VECS; k++) {
            #pragma unroll
            for (int i = 0; i < 8; i++) { run_sum += expf(__bfloat162float(cache[k].v[i]) - run_max); }
        }
    }

    // the block's (max, sum): butterfly in each warp, then thread 0 combines the warps in order
    for (int offset = 16; offset > 0; offset /= 2) {
        softmax_combine(run_max, run_sum, __shfl_xor_sync(0xffffffffu, run_max, offset),
                        __shfl_xor_sync(0xffffffffu, run_sum, offset));
    }
    if (threadIdx.x % 32 == 0) {
        part_max[threadIdx.x / 32] = run_max;
        part_sum[threadIdx.x / 32] = run_sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < CE_THREADS / 32; w++) { softmax_combine(run_max, run_sum, part_max[w], part_sum[w]); }
        row_lse = run_max + logf(run_sum);
        losses[m] = row_lse - z_target;
    }
    __syncthreads();
    if (dlogits == NULL) { return; }

    const float lse = row_lse;
    bf16* dz = dlogits + (size_t)m * Vp;
    // the last tile is still in registers; earlier ones are read again
    for (int tile = num_tiles - 1; tile >= 0; tile--) {
        if (tile < num_tiles - 1) { crossentropy_load_tile(cache, z, tile, V); }
        #pragma unroll
        for (int k = 0; k < CE_VECS; k++) {
            const int i0 = tile * CE_TILE + (k * CE_THREADS + threadIdx.x) * 8;
            if (i0 < Vp) {
                Bf16x8 d;
                #pragma unroll
                for (int i = 0; i < 8; i++) {
                    float p = expf(__bfloat162float(cache[k].v[i]) - lse);
                    d.v[i] = __float2bfloat16_rn((p - (i0 + i == target ? 1.0f : 0.0f)) * dloss);
                }
                store_bf16x8(dz + i0, d);
            }
        }
    }
}

// dlogits may be NULL (loss only) or the logits themselves
void crossentropy_forward_backward(bf16* dlogits, float* losses, const bf16* logits, const int* targets, int M, int V,
                                   int Vp, float dloss) {
    if (Vp % 8 != 0 || V > Vp) { fatal("crossentropy: Vp %d must be a multiple of 8 and >= V %d", Vp, V); }
    crossentropy_kernel<<<M, CE_THREADS, 0, main_stream>>>(dlogits, losses, logits, targets, V, Vp, dloss);
    cudaCheck(cudaGetLastError());
}

// block 0 sums the losses, block 1 + l layer l's statistics; double sums in a fixed order
__global__ void forward_stats_kernel(double* acc, const float* losses, const float* row_l1, const int* row_active,
                                     int M) {
    if (blockIdx.x == 0) {
        double loss = 0.0;
        for (int m = threadIdx.x; m < M; m += blockDim.x) { loss += losses[m]; }
        loss = block_reduce<Sum>(loss);
        if (threadIdx.x == 0) { acc[0] += loss; }
        return;
    }
    const int l = blockIdx.x - 1;
    const float* l1 = row_l1 + (size_t)l * M;
    const int* active = row_active + (size_t)l * M;
    double l1_sum = 0.0, active_sum = 0.0;
    int most = 0;
    for (int m = threadIdx.x; m < M; m += blockDim.x) {
        l1_sum += l1[m];
        active_sum += active[m];
        most = active[m] > most ? active[m] : most;
    }
    l1_sum = block_reduce<Sum>(l1_sum);
    active_sum = block_reduce<Sum>(active_sum);
    most = block_reduce<Max>(most);
    if (threadIdx.x == 0) {
        acc[1 + 3 * l] += l1_sum;
        acc[2 + 3 * l] += active_sum;
        acc[3 + 3 * l] = fmax(acc[3 + 3 * l], (double)most);
    }
}

// row_l1 and row_active are [L, M]; acc is [1 + 3L] on the device
void forward_stats_accumulate_cuda(double* acc, const float* losses, const float* row_l1, const int* row_active, int L,
                                   int M) {
    forward_stats_kernel<<<1 + L, 1024, 0, main_stream>>>(acc, losses, row_l1, row_active, M);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_CUDA_CLASSIFIER_CUH
