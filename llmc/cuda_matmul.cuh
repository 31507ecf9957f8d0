/*
 Matrix products on the GPU through cuBLASLt: bf16 operands, fp32
 accumulation, a bf16 or fp32 result.

     C[M,N] = op(A) op(B)   (+ C when accumulate)

 in row-major terms, as the CPU gemm of llmc/cpu_ops.h: op(A) is [M,K] (A is
 stored [K,M] when trans_a), op(B) is [K,N] (B is stored [N,K] when trans_b).
 cuBLASLt is column-major, and a row-major X is the column-major X^T, so we ask
 it for C^T = op(B)^T op(A)^T: B comes first. The heuristic's choice of
 algorithm is cached per shape, so after the first step no call searches.

 The few rows of a decode step (B <= GEMV_MAX_ROWS = 3) go through a GEMV of our
 own instead, y[B, N] = x[B, K] W[N, K]^T with a warp per row of W: each weight
 is read once, and the reads start before the kernel before it ends
 (launch_early). From 4 rows cuBLASLt's products are faster: the GEMV's lanes
 convert and multiply every row's x per weight, and at 4 to 8 rows that work,
 not the bytes, sets its time (dev/RESULTS.md, "Decode at 4 to 8 rows"). From 4
 to 16 rows a W of few rows (Wo: 2048 outputs, a wave of 16-row blocks) goes
 through decode_mma, tensor cores with the weights requested before the wait,
 where cuBLASLt keeps too few loads in flight ("The decode step's small
 products").
*/
#ifndef LLMC_CUDA_MATMUL_CUH
#define LLMC_CUDA_MATMUL_CUH

#include <cublasLt.h>
#include <type_traits>
#include "llmc/cuda_common.cuh"

static inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) { fatal("cuBLAS error %d at %s:%d", (int)status, file, line); }
}
#define cublasCheck(status) cublas_check((status), __FILE__, __LINE__)

static const size_t cublaslt_workspace_bytes = 32 << 20;

typedef struct {
    int M, N, K, trans_a, trans_b, accumulate, batch;
    long long stride_b, stride_c;
    cudaDataType_t c_type;
    cublasLtMatmulAlgo_t algo;
} CachedMatmulAlgo;

typedef struct {
    cublasLtHandle_t handle;
    void* workspace;
    CachedMatmulAlgo* cache;
    int cache_size, cache_capacity;
} CublasLtState;

static CublasLtState cublaslt = {NULL, NULL, NULL, 0, 0};

static inline void cublaslt_init(void) {
    if (cublaslt.handle) { return; }
    cublasCheck(cublasLtCreate(&cublaslt.handle));
    cublaslt.workspace = cuda_malloc(cublaslt_workspace_bytes);
}

static inline void cublaslt_free(void) {
    if (!cublaslt.handle) { return; }
    cublasCheck(cublasLtDestroy(cublaslt.handle));
    cuda_free(cublaslt.workspace);
    free(cublaslt.cache);
    memset(&cublaslt, 0, sizeof(cublaslt));
}

// the descriptors of a product C = op(A) op(B) (see the top of the file) in cuBLASLt's terms, for a batch of
// products C_i = op(A) op(B_i), B_i = B + i stride_b, C_i = C + i stride_c (elements; A is shared: stride 0)
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t b, a, c;
} MatmulShape;

static inline MatmulShape matmul_shape(cudaDataType_t c_type, int M, int N, int K, int trans_a, int trans_b,
                                       int batch = 1, long long stride_b = 0, long long stride_c = 0) {
    MatmulShape s;
    cublasCheck(cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // B
    cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; // A
    cublasCheck(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
    cublasCheck(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
    // column-major shapes as stored: B^T is N x K (or K x N stored), A^T is K x M (or M x K stored)
    cublasCheck(cublasLtMatrixLayoutCreate(&s.b, CUDA_R_16BF, trans_b ? K : N, trans_b ? N : K, trans_b ? K : N));
    cublasCheck(cublasLtMatrixLayoutCreate(&s.a, CUDA_R_16BF, trans_a ? M : K, trans_a ? K : M, trans_a ? M : K));
    cublasCheck(cublasLtMatrixLayoutCreate(&s.c, c_type, N, M, N));
    if (batch > 1) {
        const long long stride_a = 0;
        cublasLtMatrixLayout_t layouts[3] = {s.b, s.a, s.c};
        const long long strides[3] = {stride_b, stride_a, stride_c};
        for (int i = 0; i < 3; i++) {
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &strides[i], sizeof(strides[i])));
        }
    }
    return s;
}

static inline void matmul_shape_free(MatmulShape* s) {
    cublasCheck(cublasLtMatrixLayoutDestroy(s->b));
    cublasCheck(cublasLtMatrixLayoutDestroy(s->a));
    cublasCheck(cublasLtMatrixLayoutDestroy(s->c));
    cublasCheck(cublasLtMatmulDescDestroy(s->desc));
}

// up to `count` algorithms for the shape, the heuristic's best first; returns how many
static inline int matmul_algorithms(const MatmulShape* s, cublasLtMatmulHeuristicResult_t* results, int count) {
    cublaslt_init();
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &cublaslt_workspace_bytes, sizeof(cublaslt_workspace_bytes)));
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(cublaslt.handle, s->desc, s->b, s->a, s->c, s->c, pref, count, results,
                                               &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

// C = op(A) op(B) (+ C when accumulate) by the given algorithm
static inline void matmul_run(const MatmulShape* s, const cublasLtMatmulAlgo_t* algo, void* C, const bf16* A,
                              const bf16* B, int accumulate) {
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(cublaslt.handle, s->desc, &alpha, B, s->b, A, s->a, &beta, C, s->c, C, s->c, algo,
                               cublaslt.workspace, cublaslt_workspace_bytes, main_stream));
}

// the product by the heuristic's best algorithm, cached per shape
static inline void gemm_cublaslt(void* C, cudaDataType_t c_type, const bf16* A, const bf16* B, int M, int N, int K,
                                 int trans_a, int trans_b, int accumulate, int batch = 1, long long stride_b = 0,
                                 long long stride_c = 0) {
    cublaslt_init();
    MatmulShape shape = matmul_shape(c_type, M, N, K, trans_a, trans_b, batch, stride_b, stride_c);
    CachedMatmulAlgo* hit = NULL;
    for (int i = 0; i < cublaslt.cache_size; i++) {
        CachedMatmulAlgo* e = &cublaslt.cache[i];
        if (e->M == M && e->N == N && e->K == K && e->trans_a == trans_a && e->trans_b == trans_b &&
            e->accumulate == accumulate && e->c_type == c_type && e->batch == batch && e->stride_b == stride_b &&
            e->stride_c == stride_c) { hit = e; break; }
    }
    if (hit == NULL) {
        cublasLtMatmulHeuristicResult_t result;
        if (matmul_algorithms(&shape, &result, 1) == 0) {
            fatal("cuBLASLt has no algorithm for C[%d,%d] = op(A) op(B), K %d, trans %d%d", M, N, K, trans_a, trans_b);
        }
        if (cublaslt.cache_size == cublaslt.cache_capacity) {
            cublaslt.cache_capacity = cublaslt.cache_capacity ? 2 * cublaslt.cache_capacity : 32;
            cublaslt.cache = (CachedMatmulAlgo*)reallocCheck(cublaslt.cache, cublaslt.cache_capacity * sizeof(CachedMatmulAlgo));
        }
        hit = &cublaslt.cache[cublaslt.cache_size++];
        *hit = (CachedMatmulAlgo){M, N, K, trans_a, trans_b, accumulate, batch, stride_b, stride_c, c_type, result.algo};
    }
    matmul_run(&shape, &hit->algo, C, A, B, accumulate);
    matmul_shape_free(&shape);
}

// the overloads llmc/gpt.h calls: bf16 results (activations), fp32 results (weight gradients)
static inline void gemm(bf16* C, const bf16* A, const bf16* B, int M, int N, int K, int trans_a, int trans_b, int accumulate) {
    gemm_cublaslt(C, CUDA_R_16BF, A, B, M, N, K, trans_a, trans_b, accumulate);
}

static inline void gemm(float* C, const bf16* A, const bf16* B, int M, int N, int K, int trans_a, int trans_b, int accumulate) {
    gemm_cublaslt(C, CUDA_R_32F, A, B, M, N, K, trans_a, trans_b, accumulate);
}

// C1 = A B1^T and C2 = A B2^T ([M, K] times two [N, K]) as one batched product:
// one launch with twice the tiles, which fills the GPU's last wave better than
// two products or one [2N, K] product (the dense FFN's gate and up; dev/NOTES.md
// has the figures). Falls back to two products when B and C are not equally
// ordered in memory.
static inline void gemm_pair(bf16* C1, bf16* C2, const bf16* A, const bf16* B1, const bf16* B2, int M, int N, int K) {
    // distances between separate allocations, as integers (no pointer arithmetic across objects)
    long long stride_b = ((long long)(uintptr_t)B2 - (long long)(uintptr_t)B1) / (long long)sizeof(bf16);
    long long stride_c = ((long long)(uintptr_t)C2 - (long long)(uintptr_t)C1) / (long long)sizeof(bf16);
    if (stride_b <= 0 || stride_c <= 0) {
        gemm(C1, A, B1, M, N, K, 0, 1, 0);
        gemm(C2, A, B2, M, N, K, 0, 1, 0);
        return;
    }
    gemm_cublaslt(C1, CUDA_R_16BF, A, B1, M, N, K, 0, 1, 0, 2, stride_b, stride_c);
}

// ----------------------------------------------------------------------------
// The first STEPS 256-column steps of a weight row, loaded into a lane's
// registers before the kernel waits for the ones before it (launch_early): the
// weights stream in while those finish. With ROW_PREFETCH steps, K <= 2048 is the whole row.
constexpr int ROW_PREFETCH = 8;
template <int STEPS>
struct RowSteps { Bf16x8 v[STEPS]; };
typedef RowSteps<ROW_PREFETCH> RowPrefetch;

template <int STEPS>
__device__ __forceinline__ void prefetch_row(RowSteps<STEPS>& r, const bf16* row, int K, int lane) {
    #pragma unroll
    for (int s = 0; s < STEPS; s++) {
        if ((s * 32 + lane) * 8 < K) { r.v[s] = load_bf16x8(row + (s * 32 + lane) * 8); }
    }
}

// acc[b] += x_b . row over K (x [B, K] in shared memory, the row's first steps in
// r), lanes over 8 columns per step; the sums' order, and so their bits, do not depend on STEPS
template <int B, int STEPS>
__device__ __forceinline__ void warp_dot_rows(float (&acc)[B], const bf16* xs, const RowSteps<STEPS>& r,
                                              const bf16* row, int K, int lane) {
    #pragma unroll
    for (int s = 0; s < STEPS; s++) {
        const int k = (s * 32 + lane) * 8;
        if (k >= K) { break; }
        #pragma unroll
        for (int b = 0; b < B; b++) {
            Bf16x8 xv = *reinterpret_cast<const Bf16x8*>(xs + b * K + k);
            #pragma unroll
            for (int e = 0; e < 8; e++) { acc[b] += __bfloat162float(xv.v[e]) * __bfloat162float(r.v[s].v[e]); }
        }
    }
    #pragma unroll 4
    for (int k = (STEPS * 32 + lane) * 8; k < K; k += 256) {
        Bf16x8 wv = load_bf16x8(row + k);
        #pragma unroll
        for (int b = 0; b < B; b++) {
            Bf16x8 xv = *reinterpret_cast<const Bf16x8*>(xs + b * K + k);
            #pragma unroll
            for (int e = 0; e < 8; e++) { acc[b] += __bfloat162float(xv.v[e]) * __bfloat162float(wv.v[e]); }
        }
    }
    #pragma unroll
    for (int b = 0; b < B; b++) { acc[b] = warp_reduce<Sum>(acc[b]); }
}

// ----------------------------------------------------------------------------
// the linear layers of a decode step for B <= GEMV_MAX_ROWS rows: y[B, N] = x[B, K] W[N, K]^T
// as a GEMV: x in shared memory, a warp per row n of W reading it once (the row's
// first steps loaded into registers before the wait of the early launch), fp32
// sums, then an epilogue per row: a bf16 store (decode_linear), or the sparse
// decode FFN's gate and up (llmc/ffn/cuda_decode.cuh). A product whose blocks all
// fit on the GPU at once prefetches the whole row (122 registers, two blocks an
// SM); a larger one (qkv, the gate, the head) prefetches ROW_PREFETCH_STREAM steps
// at 80 registers, three blocks an SM, so it runs in fewer waves (dev/RESULTS.md,
// "The decode GEMV's occupancy").
constexpr int GEMV_MAX_ROWS = 3, GEMV_THREADS = 256, GEMV_WARPS = GEMV_THREADS / 32;
constexpr int ROW_PREFETCH_STREAM = 4;

// the epilogue of a plain product: y[b, n] = bf16(acc_b). (An epilogue may read
// more memory for row n; early(n, lane) requests it, for a caller that knows
// row n needs it before its sums are done, and operator() takes what it gave.
// A plain store reads nothing.)
struct StoreRow {
    bf16* y;
    int N;
    struct Early {};
    __device__ Early early(int n, int lane) const { return {}; }
    template <int B>
    __device__ void operator()(int n, const float (&acc)[B], const bf16* xs, int lane) const {
        #pragma unroll
        for (int b = 0; b < B; b++) {
            if (lane == b) { y[(size_t)b * N + n] = __float2bfloat16_rn(acc[b]); }
        }
    }
    template <int B>
    __device__ void operator()(int n, const float (&acc)[B], const bf16* xs, int lane, const Early&) const {
        (*this)(n, acc, xs, lane);
    }
};

template <int B, int STEPS, typename Epilogue>
__global__ void __launch_bounds__(GEMV_THREADS, STEPS == ROW_PREFETCH_STREAM ? 3 : 2)
gemv_kernel(Epilogue epilogue, const bf16* x, const bf16* w, int N, int K) {
    extern __shared__ __align__(16) bf16 xs[];
    const int n = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    RowSteps<STEPS> r;
    if (n < N) { prefetch_row(r, w + (size_t)n * K, K, lane); }
    grid_dependents_launch();
    grid_dependency_wait();
    for (int i = threadIdx.x * 8; i < B * K; i += GEMV_THREADS * 8) { store_bf16x8(xs + i, load_bf16x8(x + i)); }
    __syncthreads();
    if (n >= N) { return; }
    float acc[B] = {};
    warp_dot_rows<B>(acc, xs, r, w + (size_t)n * K, K, lane);
    epilogue(n, acc, xs, lane);
}

// the product with `epilogue` per row of W [N, K] for B <= GEMV_MAX_ROWS rows of x
template <int B, typename Epilogue>
static void gemv_launch(const Epilogue& epilogue, const bf16* x, const bf16* w, int N, int K) {
    auto whole_row = gemv_kernel<B, ROW_PREFETCH, Epilogue>, streaming = gemv_kernel<B, ROW_PREFETCH_STREAM, Epilogue>;
    static int num_sms = 0, per_sm = 0; // per_sm: the whole-row kernel's blocks an SM at x of per_sm_smem bytes
    static size_t per_sm_smem = 0;
    if (num_sms == 0) {
        prefer_shared_memory(whole_row);
        prefer_shared_memory(streaming);
        num_sms = device_attribute(cudaDevAttrMultiProcessorCount);
    }
    const int blocks = ceil_div(N, GEMV_WARPS);
    const size_t smem = (size_t)B * K * sizeof(bf16);
    if (smem != per_sm_smem) { // (a decode step's products mostly share one K: asked once, not every launch)
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, whole_row, GEMV_THREADS, smem));
        per_sm_smem = smem;
    }
    launch_early(blocks <= per_sm * num_sms ? whole_row : streaming, blocks, GEMV_THREADS, smem, epilogue, x, w, N, K);
}

// whether the GEMV takes B rows of K (K % 8 == 0, x in 48 KiB)
static inline bool gemv_fits(int B, int K) {
    return B <= GEMV_MAX_ROWS && K % 8 == 0 && (size_t)B * K * sizeof(bf16) <= 48 * 1024;
}

// calls rows(std::integral_constant<int, B>()) for 1 <= B <= GEMV_MAX_ROWS: a kernel built for each row
// count, chosen at run time
template <typename F>
static void with_rows(int B, F rows) {
    switch (B) {
    case 1: rows(std::integral_constant<int, 1>()); break;
    case 2: rows(std::integral_constant<int, 2>()); break;
    case 3: rows(std::integral_constant<int, 3>()); break;
    default: fatal("%d rows: the decode kernels are built for 1 to %d", B, GEMV_MAX_ROWS);
    }
}

template <typename Epilogue>
static void gemv(const Epilogue& epilogue, const bf16* x, const bf16* w, int B, int N, int K) {
    with_rows(B, [&](auto rows) { gemv_launch<decltype(rows)::value>(epilogue, x, w, N, K); });
}

// ----------------------------------------------------------------------------
// The products of a decode step of 4 to 16 rows whose W fits the GPU in one
// wave of blocks: y[B, N] = x[B, K] W[N, K]^T on tensor cores (mma.sync
// m16n8k16, W as A: 16 of its rows a block, x as B: 8 rows a tile). cuBLASLt
// runs such a product (Wo at D 2048: 128 tiles of 16 outputs) on too few SMs
// at too low a share of the bandwidth (dev/RESULTS.md, "The decode step's small
// products"). A block of 8 warps takes 16 rows of W, warp w the 32-column
// chunks w, w + 8, ... of K; lane (r, t) = (lane / 4, lane % 4) loads 16 bytes
// of rows r and r + 8 at columns 32 c + 8 t of chunk c, its first
// DECODE_MMA_PREFETCH chunks before the grid dependency wait; the mma's k index
// is permuted alike in A and B (lane t's k = 2t, 2t+1, 2t+8, 2t+9 of a chunk's
// k-step h are its columns 32 c + 8 t + 4 h + 0..3), which a dot product
// allows. The warps' fp32 partials are added in shared memory in warp order
// (the bits do not depend on the row count or on the other rows).
constexpr int DECODE_MMA_MAX_ROWS = 16, DECODE_MMA_WARPS = 8, DECODE_MMA_PREFETCH = 8;

template <int ROW_TILES>
__global__ void __launch_bounds__(32 * DECODE_MMA_WARPS, 1)
decode_mma_kernel(bf16* y, const bf16* x, const bf16* w, int B, int N, int K) {
    __shared__ float part[DECODE_MMA_WARPS][16][DECODE_MMA_MAX_ROWS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, t = lane % 4;
    const int n0 = blockIdx.x * 16, chunks = K / 32;
    const bf16* w_lo = w + (size_t)min(n0 + r, N - 1) * K;
    const bf16* w_hi = w + (size_t)min(n0 + r + 8, N - 1) * K;
    uint4 a_lo[DECODE_MMA_PREFETCH], a_hi[DECODE_MMA_PREFETCH];
    #pragma unroll
    for (int i = 0; i < DECODE_MMA_PREFETCH; i++) {
        const int c = warp + i * DECODE_MMA_WARPS;
        if (c < chunks) {
            a_lo[i] = *reinterpret_cast<const uint4*>(w_lo + 32 * c + 8 * t);
            a_hi[i] = *reinterpret_cast<const uint4*>(w_hi + 32 * c + 8 * t);
        }
    }
    grid_dependents_launch();
    grid_dependency_wait();
    float acc[ROW_TILES][4] = {};
    auto load_x = [&](uint4 (&b)[ROW_TILES], int c) {
        #pragma unroll
        for (int rt = 0; rt < ROW_TILES; rt++) {
            const int row = rt * 8 + r;
            b[rt] = row < B ? *reinterpret_cast<const uint4*>(x + (size_t)row * K + 32 * c + 8 * t) : make_uint4(0, 0, 0, 0);
        }
    };
    auto products = [&](const uint4 (&b)[ROW_TILES], uint4 lo, uint4 hi) {
        #pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t a[4] = {h ? lo.z : lo.x, h ? hi.z : hi.x, h ? lo.w : lo.y, h ? hi.w : hi.y};
            #pragma unroll
            for (int rt = 0; rt < ROW_TILES; rt++) { mma_16816(acc[rt], a, h ? b[rt].z : b[rt].x, h ? b[rt].w : b[rt].y); }
        }
    };
    // x of every prefetched chunk requested at once (one L2 round trip, not one per chunk), then the products
    uint4 b[DECODE_MMA_PREFETCH][ROW_TILES];
    #pragma unroll
    for (int i = 0; i < DECODE_MMA_PREFETCH; i++) {
        if (warp + i * DECODE_MMA_WARPS < chunks) { load_x(b[i], warp + i * DECODE_MMA_WARPS); }
    }
    #pragma unroll
    for (int i = 0; i < DECODE_MMA_PREFETCH; i++) {
        if (warp + i * DECODE_MMA_WARPS < chunks) { products(b[i], a_lo[i], a_hi[i]); }
    }
    #pragma unroll 4
    for (int c = warp + DECODE_MMA_PREFETCH * DECODE_MMA_WARPS; c < chunks; c += DECODE_MMA_WARPS) {
        uint4 bc[ROW_TILES];
        load_x(bc, c);
        products(bc, *reinterpret_cast<const uint4*>(w_lo + 32 * c + 8 * t), *reinterpret_cast<const uint4*>(w_hi + 32 * c + 8 * t));
    }
    #pragma unroll
    for (int rt = 0; rt < ROW_TILES; rt++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) { part[warp][r + (e < 2 ? 0 : 8)][rt * 8 + 2 * t + e % 2] = acc[rt][e]; }
    }
    __syncthreads();
    const int u = threadIdx.x / DECODE_MMA_MAX_ROWS, row = threadIdx.x % DECODE_MMA_MAX_ROWS;
    if (row < B && n0 + u < N) {
        float sum = part[0][u][row];
        #pragma unroll
        for (int k = 1; k < DECODE_MMA_WARPS; k++) { sum += part[k][u][row]; }
        y[(size_t)row * N + n0 + u] = __float2bfloat16_rn(sum);
    }
}

// whether decode_mma takes the product: 4 to 16 rows, K a multiple of 32, its blocks in one wave
static inline bool decode_mma_fits(int B, int N, int K) {
    static int num_sms = 0;
    if (num_sms == 0) { num_sms = device_attribute(cudaDevAttrMultiProcessorCount); }
    return B > GEMV_MAX_ROWS && B <= DECODE_MMA_MAX_ROWS && K % 32 == 0 && ceil_div(N, 16) <= num_sms;
}

static void decode_mma(bf16* y, const bf16* x, const bf16* w, int B, int N, int K) {
    if (B < 1 || B > DECODE_MMA_MAX_ROWS || K % 32 != 0) { fatal("decode_mma: %d rows of K %d, built for 1 to %d rows, K %% 32 == 0", B, K, DECODE_MMA_MAX_ROWS); }
    launch_early(B <= 8 ? decode_mma_kernel<1> : decode_mma_kernel<2>, ceil_div(N, 16), 32 * DECODE_MMA_WARPS, 0, y, x,
                 w, B, N, K);
}

// y = x W^T for a decode step: the GEMV where it fits, decode_mma where it fits, else cuBLASLt
static void decode_linear(bf16* y, const bf16* x, const bf16* w, int B, int N, int K) {
    if (gemv_fits(B, K)) { gemv(StoreRow{y, N}, x, w, B, N, K); }
    else if (decode_mma_fits(B, N, K)) { decode_mma(y, x, w, B, N, K); }
    else { gemm(y, x, w, B, N, K, 0, 1, 0); }
}

// uniform values in [-1, 1) from a hash of the index: random enough that the
// tensor cores toggle as on real data (constant data runs faster and cooler)
__global__ void fill_hash_bf16_kernel(bf16* x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = __float2bfloat16((h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

// the bf16 rate of a large product on this GPU, in FLOP/s: the denominator of
// MFU (an 8192^3 product on random data, after a warmup, median of 5)
static inline double measure_peak_bf16_flops(void) {
    const int n = 8192;
    bf16* a = (bf16*)cuda_malloc((size_t)n * n * sizeof(bf16));
    bf16* c = (bf16*)cuda_malloc((size_t)n * n * sizeof(bf16));
    fill_hash_bf16_kernel<<<1024, 256, 0, main_stream>>>(a, (size_t)n * n);
    cudaCheck(cudaGetLastError());
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    float ms[6];
    for (int i = 0; i < 6; i++) {
        cudaCheck(cudaEventRecord(start, main_stream));
        gemm(c, a, a, n, n, n, 0, 1, 0);
        cudaCheck(cudaEventRecord(stop, main_stream));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[i], start, stop));
    }
    // sort the 5 timed runs (the first is the warmup) and take the middle one
    for (int i = 1; i < 6; i++) {
        for (int j = i + 1; j < 6; j++) {
            if (ms[j] < ms[i]) { float t = ms[i]; ms[i] = ms[j]; ms[j] = t; }
        }
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cuda_free(a);
    cuda_free(c);
    return 2.0 * n * n * (double)n / (ms[3] * 1e-3);
}

#endif // LLMC_CUDA_MATMUL_CUH
