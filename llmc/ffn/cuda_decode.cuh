/*
 The sparse FFN of a decode step on the GPU: B sequences with one new row f_b
 each (B small). The gate g = f Wg^T is dense (it decides which units fire),
 then only the active units:
     list_b = {n : g_bn > 0} (increasing n),  a_bi = bf16(g_{b,n_i} bf16(f_b . Wu[n_i])),
     y_b = sum_i a_bi WdT[n_i]
 (u and h rounded as the dense path rounds them), reading the rows of Wu and
 WdT of the active units only: 2 k D bf16 per sequence instead of 2 H D. The
 list holds all H units, so it never overflows. The CPU reference of the FFN
 is the dense one (llmc/cpu_ops.h): on the units that do not fire both add 0.
 For one sequence the gate reads an int8 copy of Wg and the bf16 rows
 of the few units it cannot rule out (llmc/ffn/cuda_screened_gate.cuh: the same
 fired set and values to the bit); with more, the screen's per-row conversion
 of f costs more than the bytes it saves (dev/NOTES.md).
*/
#ifndef LLMC_FFN_CUDA_DECODE_CUH
#define LLMC_FFN_CUDA_DECODE_CUH

#include "llmc/cuda_common.cuh"
#include "llmc/cuda_hopper.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/ffn/cuda_screened_gate.cuh"
#include "llmc/ffn/policy.h"

namespace sparse_decode_detail {

// ----------------------------------------------------------------------------
// sparse decode FFN. Up to GEMV_MAX_ROWS (3) sequences: one kernel computes the gate (a warp
// per unit, as the GEMV) and, for a unit that fired in any sequence, its up
// product at once, leaving a = bf16(g bf16(u)) for every unit (0 where it did
// not fire); the down kernel lists the units with a != 0 (a unit whose h
// rounded to 0 adds nothing). More sequences: g by cuBLASLt, then on compute
// capability 9.0 one kernel of a cluster per sequence for up and down (the
// cluster's blocks share the up products through their shared memory), else
// an up kernel that lists g > 0 itself, then down.

constexpr int SPARSE_THREADS = 256, SPARSE_WARPS = SPARSE_THREADS / 32;
constexpr int SPARSE_UP_BLOCKS = 16; // blocks per sequence in up: enough warps for ~100 active units

struct Float8 { float v[8]; };

// the units n < H with a nonzero value into list (and the values into values,
// if not NULL) in increasing order; returns their number (every thread).
// values_of(n) gives the values of units n..n+7 (H % 8 == 0); thread t takes 32
// units per pass (one pass up to H = 8192), a block-wide prefix of the counts
// gives each unit its place.
template <typename Values>
__device__ int list_units(int* list, float* values, int H, Values values_of) {
    __shared__ int warp_total[SPARSE_WARPS];
    __shared__ int base;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (tid == 0) { base = 0; }
    __syncthreads();
    for (int n0 = 0; n0 < H; n0 += 32 * SPARSE_THREADS) {
        const int n = n0 + 32 * tid;
        Float8 v[4];
        unsigned int mask = 0;
        #pragma unroll
        for (int q = 0; q < 4; q++) {
            v[q] = n + 8 * q < H ? values_of(n + 8 * q) : Float8{};
            #pragma unroll
            for (int e = 0; e < 8; e++) { mask |= (unsigned int)(v[q].v[e] != 0.0f) << (8 * q + e); }
        }
        int count = __popc(mask), inclusive = warp_inclusive_sum(count);
        if (lane == 31) { warp_total[warp] = inclusive; }
        __syncthreads();
        int slot = base + inclusive - count;
        for (int w = 0; w < warp; w++) { slot += warp_total[w]; }
        #pragma unroll
        for (int j = 0; j < 32; j++) {
            if (mask >> j & 1) {
                list[slot] = n + j;
                if (values) { values[slot] = v[j / 8].v[j % 8]; }
                slot++;
            }
        }
        __syncthreads();
        if (tid == 0) {
            for (int w = 0; w < SPARSE_WARPS; w++) { base += warp_total[w]; }
        }
        __syncthreads();
    }
    return base;
}

// h = bf16(g bf16(u)) from the fp32 sum u, rounded as the dense path rounds u and h
__device__ __forceinline__ float sparse_h(float g, float u) {
    return __bfloat162float(__float2bfloat16_rn(g * __bfloat162float(__float2bfloat16_rn(u))));
}

// h of unit n for the row f_b (a warp; every lane gets it): f_b . Wu[n] by the GEMV's code, then sparse_h
__device__ __forceinline__ float sparse_up_h(const bf16* fb, const bf16* wu, int n, float g, int D, int lane) {
    float dot[1] = {};
    RowPrefetch r;
    prefetch_row(r, wu + (size_t)n * D, D, lane);
    warp_dot_rows<1>(dot, fb, r, wu + (size_t)n * D, D, lane);
    return sparse_h(g, dot[0]);
}

// B <= GEMV_MAX_ROWS sequences, the epilogue of the GEMV g = f Wg^T: g_b = bf16(acc_b) (the
// GEMV's rounding); a unit with some g_b > 0 reads Wu[n] once for all b:
// a[b, n] = bf16(g_b bf16(f_b . Wu[n])) where g_b > 0, else 0 (every a[b, n] is
// written); active (if not NULL) gets the number of g_b > 0 and active_union (if
// not NULL) 1, atomics per unit that fired. Wu[n]'s first steps are requested
// when a unit fires, or earlier by early(n, lane) (the screened gate's candidates:
// with their bf16 gate row, one DRAM round trip instead of two)
struct GateUpRow {
    float* a;
    const bf16* wu;
    int D, H;
    unsigned long long *active, *active_union;
    typedef RowSteps<ROW_PREFETCH_STREAM> Early; // (fewer registers: the GEMV's streaming kernel runs this too)
    __device__ Early early(int n, int lane) const {
        Early r;
        prefetch_row(r, wu + (size_t)n * D, D, lane);
        return r;
    }
    template <int B>
    __device__ void operator()(int n, const float (&acc)[B], const bf16* xs, int lane) const {
        finish<B, false>(n, acc, xs, lane, NULL);
    }
    template <int B>
    __device__ void operator()(int n, const float (&acc)[B], const bf16* xs, int lane, const Early& wu_row) const {
        finish<B, true>(n, acc, xs, lane, &wu_row);
    }
    template <int B, bool REQUESTED>
    __device__ void finish(int n, const float (&acc)[B], const bf16* xs, int lane, const Early* wu_row) const {
        float g[B];
        bool any = false;
        #pragma unroll
        for (int b = 0; b < B; b++) { g[b] = __bfloat162float(__float2bfloat16_rn(acc[b])); any |= g[b] > 0.0f; }
        float h[B] = {};
        if (any && active && lane == 0) {
            int fired = 0;
            #pragma unroll
            for (int b = 0; b < B; b++) { fired += g[b] > 0.0f; }
            atomicAdd(active, (unsigned long long)fired);
        }
        if (any && active_union && lane == 0) { atomicAdd(active_union, 1ull); }
        if (any) { // the same for every lane of the warp
            float u[B] = {};
            if constexpr (REQUESTED) {
                warp_dot_rows<B>(u, xs, *wu_row, wu + (size_t)n * D, D, lane);
            } else {
                warp_dot_rows<B>(u, xs, early(n, lane), wu + (size_t)n * D, D, lane);
            }
            #pragma unroll
            for (int b = 0; b < B; b++) {
                if (g[b] > 0.0f) { h[b] = sparse_h(g[b], u[b]); }
            }
        }
        #pragma unroll
        for (int b = 0; b < B; b++) {
            if (lane == b) { a[(size_t)b * H + n] = h[b]; }
        }
    }
};

// the active units of g_row (g > 0) into list in increasing order
__device__ int list_active_units(int* list, const bf16* g_row, int H) {
    return list_units(list, NULL, H, [&](int n) {
        Bf16x8 g = load_bf16x8(g_row + n);
        Float8 v;
        #pragma unroll
        for (int e = 0; e < 8; e++) { v.v[e] = __bfloat162float(g.v[e]) > 0.0f ? 1.0f : 0.0f; }
        return v;
    });
}

// a_bi = bf16(g_{b, n_i} bf16(f_b . Wu[n_i])) for the active units n_i of sequence b =
// blockIdx.y; a warp per unit. Every block lists the units itself (a few us of
// L2 reads, no extra launch); block 0 also stores the list for the down kernel
// (and adds their number to active, if not NULL).
__global__ void __launch_bounds__(SPARSE_THREADS)
sparse_up_kernel(float* a, int* list_out, int* count_out, const bf16* g, const bf16* f, const bf16* wu, int D, int H,
                 unsigned long long* active) {
    extern __shared__ int list[];
    grid_dependents_launch(); // (launched early: the wait comes before anything is read)
    grid_dependency_wait();
    const int b = blockIdx.y, lane = threadIdx.x % 32;
    const int count = list_active_units(list, g + (size_t)b * H, H);
    if (blockIdx.x == 0) {
        for (int i = threadIdx.x; i < count; i += SPARSE_THREADS) { list_out[(size_t)b * H + i] = list[i]; }
        if (threadIdx.x == 0) {
            count_out[b] = count;
            if (active) { atomicAdd(active, (unsigned long long)count); }
        }
    }
    const bf16* fb = f + (size_t)b * D;
    for (int i = blockIdx.x * SPARSE_WARPS + threadIdx.x / 32; i < count; i += SPARSE_UP_BLOCKS * SPARSE_WARPS) {
        const int n = list[i];
        const float h = sparse_up_h(fb, wu, n, __bfloat162float(g[(size_t)b * H + n]), D, lane);
        if (lane == 0) { a[(size_t)b * H + i] = h; }
    }
}

// y_b[the 256 columns from col0] = sum_i a_i WdT[unit_i] over the units and
// values staged in shared memory (so that a warp's weight loads do not wait on
// one another's addresses): a warp takes every 8th unit, a lane 8 columns, with
// the rows of DOWN_BATCH units in flight at once; the warps' sums are added in
// order. The first `staged` units' 256 columns may already be in shared memory
// (rows [staged][256]): the same sums, read from there
constexpr int SPARSE_DOWN_COLS = 256, DOWN_BATCH = 8;
__device__ void sparse_down_columns(bf16* y_row, const int* list, const float* s_a, int count, const bf16* wdT, int D,
                                    int col0, const bf16* rows = NULL, int staged = 0) {
    __shared__ float part[SPARSE_WARPS][SPARSE_DOWN_COLS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, col = col0 + lane * 8;
    float acc[8] = {};
    if (col < D) {
        for (int i0 = warp; i0 < count; i0 += SPARSE_WARPS * DOWN_BATCH) {
            Bf16x8 w[DOWN_BATCH];
            #pragma unroll
            for (int j = 0; j < DOWN_BATCH; j++) {
                const int i = i0 + j * SPARSE_WARPS;
                if (i < count) {
                    w[j] = i < staged ? load_bf16x8(rows + i * SPARSE_DOWN_COLS + lane * 8)
                                      : load_bf16x8(wdT + (size_t)list[i] * D + col);
                }
            }
            #pragma unroll
            for (int j = 0; j < DOWN_BATCH; j++) {
                const int i = i0 + j * SPARSE_WARPS;
                if (i < count) {
                    #pragma unroll
                    for (int e = 0; e < 8; e++) { acc[e] += s_a[i] * __bfloat162float(w[j].v[e]); }
                }
            }
        }
    }
    #pragma unroll
    for (int e = 0; e < 8; e++) { part[warp][lane * 8 + e] = acc[e]; }
    __syncthreads();
    const int c = col0 + threadIdx.x;
    if (c < D) {
        float sum = 0.0f;
        for (int w = 0; w < SPARSE_WARPS; w++) { sum += part[w][threadIdx.x]; }
        y_row[c] = __float2bfloat16_rn(sum);
    }
    __syncthreads(); // part is free for the next call
}

// shared memory of the down kernels: a list of up to H units and their values
static inline size_t sparse_down_smem(int H) { return (size_t)H * (sizeof(int) + sizeof(float)); }

// *active_union += the units with g > 0 in any of the B rows of g [B, H] (a thread per unit)
__global__ void fired_union_kernel(unsigned long long* active_union, const bf16* g, int B, int H) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    bool any = false;
    for (int b = 0; n < H && b < B && !any; b++) { any = __bfloat162float(g[(size_t)b * H + n]) > 0.0f; }
    const int count = warp_reduce<Sum>((int)any);
    if (threadIdx.x % 32 == 0 && count > 0) { atomicAdd(active_union, (unsigned long long)count); }
}

// down after sparse_up_kernel: the list and count it stored, a in list order
__global__ void __launch_bounds__(SPARSE_THREADS)
sparse_down_kernel(bf16* y, const float* a, const int* list, const int* count, const bf16* wdT, int D, int H) {
    extern __shared__ int s_list[];
    float* s_a = (float*)(s_list + H);
    grid_dependents_launch();
    grid_dependency_wait();
    const int b = blockIdx.y, n = count[b];
    for (int i = threadIdx.x; i < n; i += SPARSE_THREADS) {
        s_list[i] = list[(size_t)b * H + i];
        s_a[i] = a[(size_t)b * H + i];
    }
    __syncthreads();
    sparse_down_columns(y + (size_t)b * D, s_list, s_a, n, wdT, D, blockIdx.x * SPARSE_DOWN_COLS);
}

// down after sparse_gate_up_kernel: the units with a != 0, listed with their values
__global__ void __launch_bounds__(SPARSE_THREADS)
sparse_down_active_kernel(bf16* y, const float* a, const bf16* wdT, int D, int H) {
    extern __shared__ int s_list[];
    float* s_a = (float*)(s_list + H);
    grid_dependents_launch();
    grid_dependency_wait();
    const int b = blockIdx.y;
    const float* ab = a + (size_t)b * H;
    const int n = list_units(s_list, s_a, H, [&](int u) {
        const float4 lo = reinterpret_cast<const float4*>(ab + u)[0], hi = reinterpret_cast<const float4*>(ab + u)[1];
        return Float8{{lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w}};
    });
    sparse_down_columns(y + (size_t)b * D, s_list, s_a, n, wdT, D, blockIdx.x * SPARSE_DOWN_COLS);
}

// Up and down of sequence b = blockIdx.y in one kernel, a cluster of UP_DOWN_CLUSTER blocks per sequence
// (compute capability 9.0), the same bits as sparse_up_kernel then sparse_down_kernel. Every block lists the
// units of g_b > 0 (as sparse_up_kernel's blocks do) and requests its first column slice of the first
// UP_DOWN_STAGED units' W_d^T rows into shared memory at once, so that they arrive while the up products
// run; block c computes a_i for the units i = c mod UP_DOWN_CLUSTER (a warp each) and stores it into every
// block's a; after the cluster's barrier each block adds its slices of the down: columns 256 (c + k
// UP_DOWN_CLUSTER) .. + 255, k = 0, 1, ... No write to global memory, no second kernel in between.
constexpr int UP_DOWN_CLUSTER = 8, UP_DOWN_STAGED = 32;

static inline size_t sparse_up_down_smem(int H) {
    return (size_t)H * (sizeof(int) + sizeof(float)) + (size_t)UP_DOWN_STAGED * SPARSE_DOWN_COLS * sizeof(bf16);
}

__global__ void __launch_bounds__(SPARSE_THREADS)
sparse_up_down_kernel(bf16* y, const bf16* g, const bf16* f, const bf16* wu, const bf16* wdT, int D, int H,
                      unsigned long long* active) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) int s_list[];
    float* s_a = (float*)(s_list + H);
    bf16* rows = (bf16*)(s_a + H); // [UP_DOWN_STAGED][256] (H % 8 == 0: 16-byte aligned)
    cluster_arrive_relaxed(); // (waited on before the first store into another block)
    grid_dependents_launch();
    grid_dependency_wait();
    const int b = blockIdx.y, c = (int)cluster_rank(), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int count = list_active_units(s_list, g + (size_t)b * H, H);
    if (c == 0 && threadIdx.x == 0 && active) { atomicAdd(active, (unsigned long long)count); }
    const int col0 = c * SPARSE_DOWN_COLS, staged = col0 >= D ? 0 : count < UP_DOWN_STAGED ? count : UP_DOWN_STAGED;
    for (int p = threadIdx.x; p < staged * (SPARSE_DOWN_COLS / 8); p += SPARSE_THREADS) {
        const int i = p / (SPARSE_DOWN_COLS / 8), col = col0 + p % (SPARSE_DOWN_COLS / 8) * 8;
        const bf16* row = wdT + (size_t)s_list[i] * D;
        cp_async_16(rows + (size_t)p * 8, col < D ? row + col : row, col < D);
    }
    cp_async_commit();
    const bf16* fb = f + (size_t)b * D;
    bool waited = false;
    for (int i = c + UP_DOWN_CLUSTER * warp; i < count; i += UP_DOWN_CLUSTER * SPARSE_WARPS) {
        const int n = s_list[i];
        const float h = sparse_up_h(fb, wu, n, __bfloat162float(g[(size_t)b * H + n]), D, lane);
        if (!waited) { // every block of the cluster has started (its shared memory may be written)
            cluster_wait();
            waited = true;
        }
        if (lane < UP_DOWN_CLUSTER) { store_shared_cluster(s_a + i, (unsigned int)lane, h); }
    }
    if (!waited) { cluster_wait(); }
    cluster_sync(); // every a_i in every block
    cp_async_wait<0>();
    __syncthreads();
    for (int k = 0; col0 + k * UP_DOWN_CLUSTER * SPARSE_DOWN_COLS < D; k++) {
        sparse_down_columns(y + (size_t)b * D, s_list, s_a, count, wdT, D, col0 + k * UP_DOWN_CLUSTER * SPARSE_DOWN_COLS,
                            k == 0 ? rows : NULL, k == 0 ? staged : 0);
    }
#endif
}

// with their static shared memory the down kernels (and up + down in clusters)
// pass 48 KiB from H ~ 5000; the kernels of the decode FFN's early-launched
// chains ask for the largest split
static inline void sparse_down_allow_smem(int H) {
    cudaCheck(cudaFuncSetAttribute(sparse_down_active_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)sparse_down_smem(H)));
    cudaCheck(cudaFuncSetAttribute(sparse_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)sparse_down_smem(H)));
    prefer_shared_memory(sparse_down_active_kernel);
    prefer_shared_memory(sparse_down_kernel);
    prefer_shared_memory(sparse_up_kernel);
    cudaCheck(cudaFuncSetAttribute(sparse_up_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)sparse_up_down_smem(H)));
    prefer_shared_memory(sparse_up_down_kernel);
}

// whether the GPU can run a cluster of UP_DOWN_CLUSTER blocks of sparse_up_down_kernel at H units (every
// H100 and H200 can; a small slice of one may not, and then the up and down kernels run instead)
static inline bool sparse_up_down_fits(int H) {
    static int asked_h = -1;
    static bool fits = false;
    if (H != asked_h) {
        cudaLaunchAttribute cluster;
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = UP_DOWN_CLUSTER, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(UP_DOWN_CLUSTER, 1);
        config.blockDim = dim3(SPARSE_THREADS);
        config.dynamicSmemBytes = sparse_up_down_smem(H);
        config.attrs = &cluster;
        config.numAttrs = 1;
        int clusters = 0;
        cudaCheck(cudaOccupancyMaxActiveClusters(&clusters, sparse_up_down_kernel, &config));
        fits = clusters > 0;
        asked_h = H;
    }
    return fits;
}

} // namespace sparse_decode_detail

// ----------------------------------------------------------------------------
// host API

// the decode FFN's scratch for up to B sequences of H units
typedef struct {
    int* list;    // [B, H] each sequence's active units (the path above GEMV_MAX_ROWS sequences)
    int* count;   // [B] their number
    float* a;     // [B, H] h of the active units (by list place, or by unit)
} SparseDecode;

static inline void sparse_decode_alloc(SparseDecode* s, int B, int H) {
    s->list = (int*)cuda_malloc((size_t)B * H * sizeof(int));
    s->count = (int*)cuda_malloc((size_t)B * sizeof(int));
    s->a = (float*)cuda_malloc((size_t)B * H * sizeof(float));
    if ((size_t)H * sizeof(int) > 48 * 1024) {
        cudaCheck(cudaFuncSetAttribute(sparse_decode_detail::sparse_up_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(H * sizeof(int))));
    }
    sparse_decode_detail::sparse_down_allow_smem(H);
}

static inline void sparse_decode_free(SparseDecode* s) {
    cuda_free(s->list);
    cuda_free(s->count);
    cuda_free(s->a);
    memset(s, 0, sizeof(*s));
}

// y [B, D] = the FFN of f [B, D] over each row's active units (see the top of the
// file); screen: the int8 copy of this layer's Wg (or NULL); g_scratch: [B, H]
// for the path above GEMV_MAX_ROWS sequences (cuBLASLt's gate); active (if not NULL) gets
// the number of units that fired, summed over the rows, and active_union (if not
// NULL) the number that fired in some row (above GEMV_MAX_ROWS rows one more kernel)
static inline void ffn_sparse_decode(bf16* y, SparseDecode* s, const bf16* f, const bf16* wg, const bf16* wu,
                                     const bf16* wdT, int B, int D, int H, const ScreenedGate* screen,
                                     bf16* g_scratch, unsigned long long* active = NULL,
                                     unsigned long long* active_union = NULL) {
    using namespace sparse_decode_detail;
    dim3 down_grid(ceil_div(D, SPARSE_DOWN_COLS), B);
    if (screen && ffn_policy_decode_screened(B) && screened_gate_fits(B, D)) {
        screened_gate(GateUpRow{s->a, wu, D, H, active, active_union}, *screen, wg, f, B, (int*)NULL);
        launch_early(sparse_down_active_kernel, down_grid, SPARSE_THREADS, sparse_down_smem(H), y, s->a, wdT, D, H);
        return;
    }
    if (gemv_fits(B, D)) {
        gemv(GateUpRow{s->a, wu, D, H, active, active_union}, f, wg, B, H, D);
        launch_early(sparse_down_active_kernel, down_grid, SPARSE_THREADS, sparse_down_smem(H), y, s->a, wdT, D, H);
        return;
    }
    gemm(g_scratch, f, wg, B, H, D, 0, 1, 0);
    // (clusters come with compute capability 9.0, as early launches do)
    if (early_launch_supported() && sparse_up_down_fits(H)) {
        if (active_union) {
            fired_union_kernel<<<ceil_div(H, SPARSE_THREADS), SPARSE_THREADS, 0, main_stream>>>(active_union, g_scratch, B, H);
            cudaCheck(cudaGetLastError());
        }
        launch_early_clusters(UP_DOWN_CLUSTER, sparse_up_down_kernel, dim3(UP_DOWN_CLUSTER, B), SPARSE_THREADS,
                              sparse_up_down_smem(H), y, g_scratch, f, wu, wdT, D, H, active);
        return;
    }
    // (launched early, so that each launch overlaps the kernel before it)
    launch_early(sparse_up_kernel, dim3(SPARSE_UP_BLOCKS, B), SPARSE_THREADS, H * sizeof(int), s->a, s->list, s->count,
                 g_scratch, f, wu, D, H, active);
    if (active_union) {
        fired_union_kernel<<<ceil_div(H, SPARSE_THREADS), SPARSE_THREADS, 0, main_stream>>>(active_union, g_scratch, B, H);
        cudaCheck(cudaGetLastError());
    }
    launch_early(sparse_down_kernel, down_grid, SPARSE_THREADS, sparse_down_smem(H), y, s->a, s->list, s->count, wdT,
                 D, H);
}

#endif // LLMC_FFN_CUDA_DECODE_CUH
