/*
 Inference on the GPU: bf16 weights, a key/value cache, prefill of a batch of
 prompts of different lengths, then decode of 1..max_seqs sequences, one new
 token each per step. The math is the model's (llmc/gpt.h); per layer l and row
 (sequence s, position p):
     a = RMSNorm(x);  qkv = a Wqkv^T;  RoPE(q, k at p);  cache[l, s, p] = k, v
     x += Attn(q, cache[l, s, 0..p]) Wo^T
     f = RMSNorm(x);  x += FFN(f)
 and logits = RMSNorm(x) E^T of each sequence's last row.

 Prefill: the prompts' tokens are rows of one [M, D] batch (M = sum of their
 lengths): the products, norms and the FFN do not care where a sequence ends;
 RoPE and the cache take each row's (sequence, position) from device arrays,
 and attention runs per prompt over its own rows (llmc/cuda_attention.cuh).
 The FFN is dense (cuBLAS gate and up, relu * mul, down) or TwELL
 (twell_ffn_forward of llmc/cuda_twell.cuh: the packing gate, then the fused
 up + down; its status is read after every layer, and a layer whose record
 buffer was too small is grown and run again, so the output is always exact).

 Decode, B sequences with one new token each:
 - attention: s_t = q . k_t / sqrt(hd), p = softmax(s), out = sum_t p_t v_t over
   the cache, split into blocks of 128 positions that are combined after
   (flash-decoding), so a long cache spreads over many SMs; RoPE of the new q
   and k and the cache write happen inside it (one kernel less per layer);
 - linear layers (qkv, Wo, gate, up, logits) for B <= 8: a GEMV of our own (a
   warp per output, each weight read once); above 8 rows, cuBLASLt;
 - dense FFN: g, u by the GEMV, h = relu(g) u, y = h WdT by cuBLASLt;
 - sparse FFN: the gate g = f Wg^T, then only the active units:
       list_b = {n : g_bn > 0} (increasing n),  a_bi = bf16(g_{b,n_i} bf16(f_b . Wu[n_i])),
       y_b = sum_i a_bi WdT[n_i]
   (u and h rounded as the dense path rounds them), reading the rows of Wu and
   WdT of the active units only: 2 k D bf16 per sequence instead of 2 H D. The
   list holds all H units, so it never overflows.
 A decode step is a CUDA graph (positions and tokens live in device memory), so
 the ~10 launches per layer cost the GPU's time, not the host's.

 Benchmark-only synthetic sparsity (docs/SPARSE.md; never written to a checkpoint):
 our model has no biases, so a constant feature carries them. Channel D-1 of
 the residual stream is set to e = 0.02 in every embedding row, and nothing
 writes to it (row D-1 of Wo and column D-1 of WdT are 0; column D-1 of Wqkv
 and Wu are 0 too, so attention and u ignore it). Then f = RMSNorm(x) has
 f[D-1] = e w / rms(x), and g_n = f_data . Wg[n]_data + f[D-1] Wg[n][D-1]. The
 test g_n > 0 does not depend on rms(x), and f_data . Wg[n]_data is about
 N(0, |f_data|^2 |Wg[n]_data|^2 / (D - 1)); so with
     Wg[n][D-1] = -t rho_l |Wg[n]_data| / sqrt(D - 1),   rho_l = mean |f_data| / f[D-1],
 t = Phi^-1(1 - k / H), unit n fires for about k / H of the tokens. rho_l is
 measured on layer l's FFN input during one calibration prefill, before layer
 l's gate runs (so it sees the already-sparse layers below it).

 Requirements: head size 16, 32, 64 or 128, D and H multiples of 8;
 the TwELL prefill also wants D % 64 == 0 (else prefill runs dense; --bench says so).
*/
#ifndef LLMC_CUDA_INFER_CUH
#define LLMC_CUDA_INFER_CUH

#include <math.h>
#include "llmc/cuda_attention.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/cuda_encoder.cuh"
#include "llmc/cuda_matmul.cuh"
#include "llmc/cuda_rmsnorm.cuh"
#include "llmc/cuda_rope.cuh"
#include "llmc/cuda_twell.cuh"
#include "llmc/model.h"
#include "llmc/synthetic.h"

typedef enum { INFER_FFN_DENSE, INFER_FFN_TWELL } InferFFN;

namespace infer_detail {

// ----------------------------------------------------------------------------
// prefill: RoPE at each row's own position (the rope_kernel's angle and
// rounding), then the row's k and v into the cache of its sequence. One thread
// per (row, pair i), as rope_kernel: the angle once, then pair i of every q and
// k head (a thread per head as well computed each angle 64 times: 0.40 ms per
// layer at 16384 rows). (Decode does this inside its attention.)
__global__ void rope_cache_kernel(bf16* qkv, bf16* k_cache, bf16* v_cache, const int* row_slot, const int* row_pos,
                                  int M, int NH, int NKV, int hd, int cache_len, float theta) {
    const int half = hd / 2, KVD = NKV * hd;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)M * half) { return; }
    const int i = (int)(idx % half), m = (int)(idx / half), pos = row_pos[m];
    float sin_a, cos_a;
    rope_angle(pos, i, hd, theta, &sin_a, &cos_a);
    bf16* x = qkv + (size_t)m * (NH + 2 * NKV) * hd + i;
    bf16 *kc = k_cache + ((size_t)row_slot[m] * cache_len + pos) * KVD + i, *vc = v_cache + (kc - k_cache);
    #pragma unroll 4
    for (int h = 0; h < NH + NKV; h++) {
        bf16* xh = x + h * hd;
        rope_turn(&xh[0], &xh[half], __bfloat162float(xh[0]), __bfloat162float(xh[half]), sin_a, cos_a);
        if (h >= NH) {
            const int c = (h - NH) * hd;
            kc[c] = xh[0];
            kc[c + half] = xh[half];
            vc[c] = xh[KVD];
            vc[c + half] = xh[KVD + half];
        }
    }
}

// ----------------------------------------------------------------------------
// decode attention, split over the cache (flash-decoding), RoPE included: the
// new row's q and k (in qkv, not yet turned) are turned at position pos[b] here
// (rope_angle/rope_turn, the bits of the prefill's RoPE), the new key and value
// are taken from qkv, and the first q head of each kv head's group stores them
// in the cache for later steps. Block (head h, sequence b, split j) takes
// positions 128 j .. 128 j + 127 (those <= pos[b]):
// a thread scores one key, then groups of threads sum p v over the split's
// positions (the keys and values come into shared memory by cp.async before
// the wait: at 40 registers a thread, not 168 with them in registers, the
// blocks fit beside a block of the qkv GEMV, so they are resident with their
// cache loaded before it ends);
// the split leaves its max m_j, sum l_j = sum exp(s - m_j) and
// o_j = sum exp(s - m_j) v. The last of a head's splits to finish (a counter
// per head and sequence) combines them, in split order:
//     m = max_j m_j,  out = sum_j exp(m_j - m) o_j / sum_j exp(m_j - m) l_j
// (a cache of one split writes out = o_0 / l_0 at once: the same bits).
constexpr int DECODE_SPLIT = 128; // positions per split = threads per block

// out[b, h] from the `used` splits of (b, h), a thread per output dimension
__device__ void decode_attention_combine(bf16* out, const float* part_o, const float* part_ml, int b, int h, int NH,
                                         int hd, int splits, int used) {
    const size_t first = ((size_t)b * NH + h) * splits;
    float m = -INFINITY;
    for (int j = 0; j < used; j++) { m = fmaxf(m, part_ml[2 * (first + j)]); }
    float l = 0.0f;
    for (int j = 0; j < used; j++) { l += expf(part_ml[2 * (first + j)] - m) * part_ml[2 * (first + j) + 1]; }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < used; j++) { o += expf(part_ml[2 * (first + j)] - m) * part_o[(first + j) * hd + d]; }
        out[(size_t)b * NH * hd + h * hd + d] = __float2bfloat16_rn(o / l);
    }
}

// the split's keys and values in shared memory: a key row padded by 16 bytes so
// that the threads of a quarter warp, each reading its own key, hit every bank
template <int HD> __host__ __device__ constexpr int decode_key_stride() { return HD + 8; }
template <int HD> constexpr size_t decode_attention_smem() {
    return (size_t)DECODE_SPLIT * (decode_key_stride<HD>() + HD) * sizeof(bf16);
}

template <int HD>
__global__ void __launch_bounds__(DECODE_SPLIT)
decode_attention_split_kernel(bf16* out, float* part_o, float* part_ml, int* splits_done, const bf16* qkv,
                              bf16* k_cache, bf16* v_cache, const int* pos, int NH, int NKV, int cache_len, int splits,
                              float scale, float theta) {
    constexpr int VECS = HD / 8, GROUPS = DECODE_SPLIT / VECS, HALF = HD / 2, KS = decode_key_stride<HD>();
    __shared__ float q[HD];
    __shared__ float p[DECODE_SPLIT];
    __shared__ float part[GROUPS][HD];
    extern __shared__ __align__(16) bf16 kv[];
    bf16 *ks = kv, *vs = kv + DECODE_SPLIT * KS; // [DECODE_SPLIT][KS], [DECODE_SPLIT][HD]
    const int h = blockIdx.x, b = blockIdx.y, j = blockIdx.z, tid = threadIdx.x;
    // pos comes from the host before the step and the cache before the new position
    // n - 1 from earlier steps: both are read before waiting for the kernels before
    // this one (which write qkv), and so is the angle
    const int n = pos[b] + 1, t0 = j * DECODE_SPLIT, KVD = NKV * HD, kvh = h / (NH / NKV);
    if (t0 >= n) { return; } // the whole block: past this sequence's end
    const bool has_new = n - 1 < t0 + DECODE_SPLIT; // this split holds the new position
    const bf16* kb = k_cache + (size_t)b * cache_len * KVD + kvh * HD;
    const bf16* vb = v_cache + (size_t)b * cache_len * KVD + kvh * HD;
    const int v = tid % VECS, grp = tid / VECS;
    if (t0 + tid < n - 1) { // thread tid brings position t0 + tid
        #pragma unroll
        for (int e = 0; e < VECS; e++) {
            cp_async_16(ks + tid * KS + e * 8, kb + (size_t)(t0 + tid) * KVD + e * 8, true);
            cp_async_16(vs + tid * HD + e * 8, vb + (size_t)(t0 + tid) * KVD + e * 8, true);
        }
    }
    cp_async_commit();
    float sin_a = 0.0f, cos_a = 0.0f;
    if (tid < HALF) { rope_angle(n - 1, tid, HD, theta, &sin_a, &cos_a); }
    grid_dependents_launch();
    grid_dependency_wait();
    const bf16* row = qkv + (size_t)b * (NH + 2 * NKV) * HD;
    const bf16 *k_row = row + (NH + kvh) * HD, *v_row = row + (NH + NKV + kvh) * HD;
    if (tid < HALF) {
        bf16 r1, r2;
        rope_turn(&r1, &r2, __bfloat162float(row[h * HD + tid]), __bfloat162float(row[h * HD + tid + HALF]), sin_a, cos_a);
        q[tid] = __bfloat162float(r1) * scale;
        q[tid + HALF] = __bfloat162float(r2) * scale;
        if (has_new) { // the new position's key (turned) and value, into the split's rows and the cache
            bf16 *k_new = ks + (n - 1 - t0) * KS, *v_new = vs + (n - 1 - t0) * HD;
            rope_turn(&k_new[tid], &k_new[tid + HALF], __bfloat162float(k_row[tid]), __bfloat162float(k_row[tid + HALF]),
                      sin_a, cos_a);
            v_new[tid] = v_row[tid];
            v_new[tid + HALF] = v_row[tid + HALF];
            if (h % (NH / NKV) == 0) {
                const size_t c = ((size_t)b * cache_len + n - 1) * KVD + kvh * HD + tid;
                k_cache[c] = k_new[tid];
                k_cache[c + HALF] = k_new[tid + HALF];
                v_cache[c] = v_new[tid];
                v_cache[c + HALF] = v_new[tid + HALF];
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    float s = -INFINITY;
    if (t0 + tid < n) {
        s = 0.0f;
        #pragma unroll
        for (int c = 0; c < VECS; c++) {
            const Bf16x8 k = load_bf16x8(ks + tid * KS + c * 8);
            #pragma unroll
            for (int e = 0; e < 8; e++) { s += q[c * 8 + e] * __bfloat162float(k.v[e]); }
        }
    }
    const float mx = block_reduce<Max>(s);
    const float pe = t0 + tid < n ? expf(s - mx) : 0.0f;
    p[tid] = pe;
    const float l = block_reduce<Sum>(pe); // its barriers also publish p
    float acc[8] = {};
    #pragma unroll
    for (int i = 0; i < VECS; i++) {
        int t = grp + i * GROUPS;
        if (t0 + t < n) { // never past the end: the cache there is not written
            const Bf16x8 val = load_bf16x8(vs + t * HD + v * 8);
            #pragma unroll
            for (int e = 0; e < 8; e++) { acc[e] += p[t] * __bfloat162float(val.v[e]); }
        }
    }
    #pragma unroll
    for (int e = 0; e < 8; e++) { part[grp][v * 8 + e] = acc[e]; }
    __syncthreads();
    const size_t split = ((size_t)b * NH + h) * splits + j;
    const int used = (n - 1) / DECODE_SPLIT + 1;
    for (int d = tid; d < HD; d += DECODE_SPLIT) {
        float o = 0.0f;
        for (int g = 0; g < GROUPS; g++) { o += part[g][d]; }
        if (used == 1) { out[(size_t)b * NH * HD + h * HD + d] = __float2bfloat16_rn(o / l); } // the combine's bits
        else { part_o[split * HD + d] = o; }
    }
    if (used == 1) { return; } // the only split: nothing to combine
    if (tid == 0) { part_ml[2 * split] = mx; part_ml[2 * split + 1] = l; }
    if (block_arrives_last(splits_done + (size_t)b * NH + h, used)) { // the last split combines
        decode_attention_combine(out, part_o, part_ml, b, h, NH, HD, splits, used);
    }
}

static inline int decode_splits(int cache_len) { return ceil_div(cache_len, DECODE_SPLIT); }

// the head sizes the decode attention is built for
static inline bool decode_attention_supports(int hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128; }

template <int HD>
static void decode_attention_launch(dim3 grid, bf16* out, float* part_o, float* part_ml, int* splits_done,
                                    const bf16* qkv, bf16* k_cache, bf16* v_cache, const int* pos, int NH, int NKV,
                                    int cache_len, int splits, float theta) {
    const size_t smem = decode_attention_smem<HD>(); // 68 KB at HD 128: past the default 48
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(decode_attention_split_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
        prefer_shared_memory(decode_attention_split_kernel<HD>);
        configured = true;
    }
    launch_early(decode_attention_split_kernel<HD>, grid, DECODE_SPLIT, smem, out, part_o, part_ml, splits_done, qkv,
                 k_cache, v_cache, pos, NH, NKV, cache_len, splits, 1.0f / sqrtf((float)HD), theta);
}

// out [B, NH hd] from the new rows qkv [B, QKV] (q and k not yet turned) and the
// cache, where the new k and v go (position pos[b] of sequence b); part_o, part_ml:
// scratch of B NH splits (hd + 2) floats; splits_done: B NH zeros (left zero)
static void decode_attention(bf16* out, float* part_o, float* part_ml, int* splits_done, const bf16* qkv, bf16* k_cache,
                             bf16* v_cache, const int* pos, int B, int NH, int NKV, int hd, int cache_len, float theta) {
    const int splits = decode_splits(cache_len);
    const dim3 grid(NH, B, splits);
    switch (hd) {
    case 16: decode_attention_launch<16>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, pos, NH, NKV, cache_len, splits, theta); break;
    case 32: decode_attention_launch<32>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, pos, NH, NKV, cache_len, splits, theta); break;
    case 64: decode_attention_launch<64>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, pos, NH, NKV, cache_len, splits, theta); break;
    case 128: decode_attention_launch<128>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, pos, NH, NKV, cache_len, splits, theta); break;
    default: fatal("decode attention: head size %d, built for 16, 32, 64, 128", hd);
    }
}

// ----------------------------------------------------------------------------
// The first ROW_PREFETCH 256-column steps of a weight row, loaded into a lane's
// registers before the kernel waits for the ones before it (launch_early): the
// weights stream in while those finish. K <= 2048 is the whole row.
constexpr int ROW_PREFETCH = 8;
struct RowPrefetch { Bf16x8 v[ROW_PREFETCH]; };

__device__ __forceinline__ void prefetch_row(RowPrefetch& r, const bf16* row, int K, int lane) {
    #pragma unroll
    for (int s = 0; s < ROW_PREFETCH; s++) {
        if ((s * 32 + lane) * 8 < K) { r.v[s] = load_bf16x8(row + (s * 32 + lane) * 8); }
    }
}

// acc[b] += x_b . row over K (x [B, K] in shared memory, the row's first steps in
// r), lanes over 8 columns per step
template <int B>
__device__ __forceinline__ void warp_dot_rows(float (&acc)[B], const bf16* xs, const RowPrefetch& r, const bf16* row,
                                              int K, int lane) {
    #pragma unroll
    for (int s = 0; s < ROW_PREFETCH; s++) {
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
    for (int k = (ROW_PREFETCH * 32 + lane) * 8; k < K; k += 256) {
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
// the linear layers of a decode step for B <= 8 rows: y[B, N] = x[B, K] W[N, K]^T
// as a GEMV: x in shared memory, a warp per row n of W reading it once (the row
// loaded into registers before the wait of the early launch), fp32 sums, then
// an epilogue per row: a bf16 store, or the sparse FFN's gate and up below
constexpr int GEMV_MAX_ROWS = 8, GEMV_THREADS = 256, GEMV_WARPS = GEMV_THREADS / 32;

// the epilogue of a plain product: y[b, n] = bf16(acc_b)
struct StoreRow {
    bf16* y;
    int N;
    template <int B>
    __device__ void operator()(int n, const float (&acc)[B], const bf16* xs, int lane) const {
        #pragma unroll
        for (int b = 0; b < B; b++) {
            if (lane == b) { y[(size_t)b * N + n] = __float2bfloat16_rn(acc[b]); }
        }
    }
};

template <int B, typename Epilogue>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(Epilogue epilogue, const bf16* x, const bf16* w, int N, int K) {
    extern __shared__ __align__(16) bf16 xs[];
    const int n = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    RowPrefetch r;
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

// the product with `epilogue` per row of W [N, K] for B <= 8 rows of x
template <int B, typename Epilogue>
static void gemv_launch(const Epilogue& epilogue, const bf16* x, const bf16* w, int N, int K) {
    static bool configured = false;
    if (!configured) { prefer_shared_memory(gemv_kernel<B, Epilogue>); configured = true; }
    launch_early(gemv_kernel<B, Epilogue>, ceil_div(N, GEMV_WARPS), GEMV_THREADS, (size_t)B * K * sizeof(bf16), epilogue,
                 x, w, N, K);
}

// whether the GEMV takes B rows of K (K % 8 == 0, x in 48 KiB)
static inline bool gemv_fits(int B, int K) {
    return B <= GEMV_MAX_ROWS && K % 8 == 0 && (size_t)B * K * sizeof(bf16) <= 48 * 1024;
}

template <typename Epilogue>
static void gemv(const Epilogue& epilogue, const bf16* x, const bf16* w, int B, int N, int K) {
    switch (B) {
    case 1: gemv_launch<1>(epilogue, x, w, N, K); break;
    case 2: gemv_launch<2>(epilogue, x, w, N, K); break;
    case 3: gemv_launch<3>(epilogue, x, w, N, K); break;
    case 4: gemv_launch<4>(epilogue, x, w, N, K); break;
    case 5: gemv_launch<5>(epilogue, x, w, N, K); break;
    case 6: gemv_launch<6>(epilogue, x, w, N, K); break;
    case 7: gemv_launch<7>(epilogue, x, w, N, K); break;
    case 8: gemv_launch<8>(epilogue, x, w, N, K); break;
    default: fatal("gemv: %d rows, built for 1 to %d", B, GEMV_MAX_ROWS);
    }
}

// y = x W^T for a decode step: the GEMV where it fits, else cuBLASLt
static void decode_linear(bf16* y, const bf16* x, const bf16* w, int B, int N, int K) {
    if (gemv_fits(B, K)) { gemv(StoreRow{y, N}, x, w, B, N, K); }
    else { gemm(y, x, w, B, N, K, 0, 1, 0); }
}

// ----------------------------------------------------------------------------
// sparse decode FFN. Up to 8 sequences: one kernel computes the gate (a warp
// per unit, as the GEMV) and, for a unit that fired in any sequence, its up
// product at once, leaving a = bf16(g bf16(u)) for every unit (0 where it did
// not fire); the down kernel lists the units with a != 0 (a unit whose h
// rounded to 0 adds nothing). More sequences: g by cuBLASLt, then an up kernel
// that lists g > 0 itself, then down.

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

// B <= 8 sequences, the epilogue of the GEMV g = f Wg^T: g_b = bf16(acc_b) (the
// GEMV's rounding); a unit with some g_b > 0 reads Wu[n] once for all b:
// a[b, n] = bf16(g_b bf16(f_b . Wu[n])) where g_b > 0, else 0 (every a[b, n] is written)
struct GateUpRow {
    float* a;
    const bf16* wu;
    int D, H;
    template <int B>
    __device__ void operator()(int n, const float (&acc)[B], const bf16* xs, int lane) const {
        float g[B];
        bool any = false;
        #pragma unroll
        for (int b = 0; b < B; b++) { g[b] = __bfloat162float(__float2bfloat16_rn(acc[b])); any |= g[b] > 0.0f; }
        float h[B] = {};
        if (any) { // the same for every lane of the warp
            float u[B] = {};
            RowPrefetch r;
            prefetch_row(r, wu + (size_t)n * D, D, lane);
            warp_dot_rows<B>(u, xs, r, wu + (size_t)n * D, D, lane);
            #pragma unroll
            for (int b = 0; b < B; b++) {
                if (g[b] > 0.0f) { h[b] = __bfloat162float(__float2bfloat16_rn(g[b] * __bfloat162float(__float2bfloat16_rn(u[b])))); }
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
// L2 reads, no extra launch); block 0 also stores the list for the down kernel.
__global__ void __launch_bounds__(SPARSE_THREADS)
sparse_up_kernel(float* a, int* list_out, int* count_out, const bf16* g, const bf16* f, const bf16* wu, int D, int H) {
    extern __shared__ int list[];
    const int b = blockIdx.y, lane = threadIdx.x % 32;
    const int count = list_active_units(list, g + (size_t)b * H, H);
    if (blockIdx.x == 0) {
        for (int i = threadIdx.x; i < count; i += SPARSE_THREADS) { list_out[(size_t)b * H + i] = list[i]; }
        if (threadIdx.x == 0) { count_out[b] = count; }
    }
    const bf16* fb = f + (size_t)b * D;
    for (int i = blockIdx.x * SPARSE_WARPS + threadIdx.x / 32; i < count; i += SPARSE_UP_BLOCKS * SPARSE_WARPS) {
        const int n = list[i];
        float dot[1] = {};
        RowPrefetch r;
        prefetch_row(r, wu + (size_t)n * D, D, lane);
        warp_dot_rows<1>(dot, fb, r, wu + (size_t)n * D, D, lane);
        if (lane == 0) { // h = bf16(g bf16(u)), rounded as the dense path rounds u and h
            float u = __bfloat162float(__float2bfloat16_rn(dot[0]));
            a[(size_t)b * H + i] = __bfloat162float(__float2bfloat16_rn(__bfloat162float(g[(size_t)b * H + n]) * u));
        }
    }
}

// y_b[256 columns of block x] = sum_i a_i WdT[unit_i] over the units and values
// staged in shared memory (so that a warp's weight loads do not wait on one
// another's addresses): a warp takes every 8th unit, a lane 8 columns, with the
// rows of DOWN_BATCH units in flight at once; the warps' sums are added in order
constexpr int SPARSE_DOWN_COLS = 256, DOWN_BATCH = 8;
__device__ void sparse_down_columns(bf16* y_row, const int* list, const float* s_a, int count, const bf16* wdT, int D) {
    __shared__ float part[SPARSE_WARPS][SPARSE_DOWN_COLS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, col = blockIdx.x * SPARSE_DOWN_COLS + lane * 8;
    float acc[8] = {};
    if (col < D) {
        for (int i0 = warp; i0 < count; i0 += SPARSE_WARPS * DOWN_BATCH) {
            Bf16x8 w[DOWN_BATCH];
            #pragma unroll
            for (int j = 0; j < DOWN_BATCH; j++) {
                const int i = i0 + j * SPARSE_WARPS;
                if (i < count) { w[j] = load_bf16x8(wdT + (size_t)list[i] * D + col); }
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
    const int c = blockIdx.x * SPARSE_DOWN_COLS + threadIdx.x;
    if (c < D) {
        float sum = 0.0f;
        for (int w = 0; w < SPARSE_WARPS; w++) { sum += part[w][threadIdx.x]; }
        y_row[c] = __float2bfloat16_rn(sum);
    }
}

// shared memory of the down kernels: a list of up to H units and their values
static inline size_t sparse_down_smem(int H) { return (size_t)H * (sizeof(int) + sizeof(float)); }

// down after sparse_up_kernel: the list and count it stored, a in list order
__global__ void __launch_bounds__(SPARSE_THREADS)
sparse_down_kernel(bf16* y, const float* a, const int* list, const int* count, const bf16* wdT, int D, int H) {
    extern __shared__ int s_list[];
    float* s_a = (float*)(s_list + H);
    const int b = blockIdx.y, n = count[b];
    for (int i = threadIdx.x; i < n; i += SPARSE_THREADS) {
        s_list[i] = list[(size_t)b * H + i];
        s_a[i] = a[(size_t)b * H + i];
    }
    __syncthreads();
    sparse_down_columns(y + (size_t)b * D, s_list, s_a, n, wdT, D);
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
    sparse_down_columns(y + (size_t)b * D, s_list, s_a, n, wdT, D);
}

// with their static shared memory the down kernels pass 48 KiB from H ~ 5000
static inline void sparse_down_allow_smem(int H) {
    cudaCheck(cudaFuncSetAttribute(sparse_down_active_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)sparse_down_smem(H)));
    cudaCheck(cudaFuncSetAttribute(sparse_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)sparse_down_smem(H)));
    prefer_shared_memory(sparse_down_active_kernel);
}

// ----------------------------------------------------------------------------
// small helpers: gathering each sequence's last row, fp32 -> bf16 weights

__global__ void gather_rows_kernel(bf16* out, const bf16* in, const int* rows, int n, int D) {
    const int r = blockIdx.x;
    for (int d = threadIdx.x * 8; d < D; d += blockDim.x * 8) {
        store_bf16x8(out + (size_t)r * D + d, load_bf16x8(in + (size_t)rows[r] * D + d));
    }
}

__global__ void float_to_bf16_kernel(bf16* out, const float* in, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = __float2bfloat16_rn(in[i]);
    }
}

// ----------------------------------------------------------------------------
// the synthetic-sparse benchmark model (see the top of this file)

// N(0, std^2) from a hash of (seed, i): Box-Muller on two 24-bit uniforms
__global__ void fill_normal_kernel(bf16* x, size_t n, float std, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h1 = (uint32_t)i * 2654435761u ^ seed, h2 = (uint32_t)(i >> 32) * 2246822519u ^ (seed * 3266489917u + (uint32_t)i);
        h1 ^= h1 >> 15; h1 *= 2246822519u; h1 ^= h1 >> 13; h1 *= 3266489917u; h1 ^= h1 >> 16;
        h2 ^= h2 >> 15; h2 *= 2654435761u; h2 ^= h2 >> 13; h2 *= 2246822519u; h2 ^= h2 >> 16;
        float u1 = ((h1 >> 8) + 1) * (1.0f / 16777217.0f), u2 = (h2 >> 8) * (1.0f / 16777216.0f);
        x[i] = __float2bfloat16_rn(std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
    }
}

// x[r * stride + col] = value for r < rows
__global__ void set_column_kernel(bf16* x, int rows, size_t stride, int col, float value) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
        x[(size_t)r * stride + col] = __float2bfloat16_rn(value);
    }
}

// rho = mean over the first rows (at most 1024) of |f_data| / f[D-1]: one block, fixed order
__global__ void carrier_ratio_kernel(float* rho, const bf16* f, int M, int D) {
    const int rows = M < 1024 ? M : 1024, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    float total = 0.0f;
    for (int m = warp; m < rows; m += warps) {
        float sq = 0.0f;
        for (int d = lane; d < D - 1; d += 32) { float v = __bfloat162float(f[(size_t)m * D + d]); sq += v * v; }
        sq = warp_reduce<Sum>(sq);
        total += sqrtf(sq) / fabsf(__bfloat162float(f[(size_t)m * D + D - 1]));
    }
    total = block_reduce<Sum>(lane == 0 ? total : 0.0f);
    if (threadIdx.x == 0) { *rho = total / rows; }
}

// Wg[n][D-1] = -t rho |Wg[n]_data| / sqrt(D - 1): a warp per unit
__global__ void gate_offset_kernel(bf16* wg, const float* rho, int H, int D, float t) {
    const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= H) { return; }
    float sq = 0.0f;
    for (int d = lane; d < D - 1; d += 32) { float v = __bfloat162float(wg[(size_t)n * D + d]); sq += v * v; }
    sq = warp_reduce<Sum>(sq);
    if (lane == 0) { wg[(size_t)n * D + D - 1] = __float2bfloat16_rn(-t * *rho * sqrtf(sq / (D - 1))); }
}

} // namespace infer_detail

// ----------------------------------------------------------------------------
// host API

// A prefill of fewer rows than this runs the dense FFN in TwELL mode too: there
// every weight row is read anyway (the units a few hundred tokens fire cover
// most of H), and TwELL's one status read per layer (exactness) costs more
// than the gate saves. Measured on an H100 at the 1.5B shape (dev/NOTES.md).
constexpr int TWELL_PREFILL_MIN_ROWS = 4096;

typedef struct {
    GPTConfig config;
    InferFFN ffn;
    int max_seqs;      // sequences the cache holds (the decode batch)
    int max_rows;      // tokens of one prefill (the sum of the prompts' lengths)
    int cache_len;     // positions per sequence in the cache (<= max_seq_len)
    bf16* params;      // all weights, bf16, the checkpoint's layout (llmc/model.h)
    bf16* param[NUM_PARAM_TENSORS];
    bf16 *k_cache, *v_cache; // [L, max_seqs, cache_len, KVD]
    // activations, [rows, ...] with rows = max(max_rows, max_seqs)
    bf16 *x, *x_mid, *normed, *qkv, *att, *proj;
    bf16* gu;          // [rows, 2H]: g and u of the dense FFN, TwELL's scratch
    bf16* last;        // [max_seqs, D] each sequence's last row, final-normed
    bf16* logits;      // [max_seqs, Vp]
    float* lse;        // [max_rows * NH]
    float *part_o, *part_ml; // decode attention's splits: [max_seqs, NH, splits] x hd, x 2
    int* splits_done;        // [max_seqs, NH] splits finished (zero between steps)
    int *tokens, *row_slot, *row_pos, *last_row; // device: per row; per sequence
    int *active_list, *active_count;             // [max_seqs, H], [max_seqs]: decode's active units
    float* active_a;                             // [max_seqs, H]: h of the active units (by list place, or by unit)
    uint16_t* logits_host;                       // [max_seqs, Vp] bf16 bits, pinned
    // TwELL prefill: one set of buffers for the current M, per-layer activity
    TwellFFN twell;
    int twell_rows;    // M of twell (0: none)
    TwellChoice twell_choice; // TWELL_AUTO (dense for too active layers) unless a test forces a path
    int twell_dense_timed;    // the dense FFN was timed at this M (what auto compares the sparse path with)
    double* layer_active; // [L] units per row the layer's last prefill saw (-1: none yet)
    long long regrows; // TwELL buffer growths (each reruns a layer)
    int sparse_prefill_ok; // 0: the shape is not one the TwELL GPU path takes (prefill runs dense)
    int twell_min_rows;    // prefills of fewer rows run the dense FFN (TWELL_PREFILL_MIN_ROWS; 0: never)
    // the decode step as a graph, for one batch size and FFN
    cudaGraphExec_t graph;
    int graph_seqs;
    InferFFN graph_ffn;
    int use_graph;
    // synthetic sparsity: the units per token to aim for during the next prefill (0: off)
    double calibrate_k;
    float* rho;        // [L] device
} GpuModel;

static inline void gpu_model_create(GpuModel* m, const GPTConfig* c, int max_seqs, int max_rows, int cache_len) {
    config_validate(c);
    memset(m, 0, sizeof(*m));
    m->config = *c;
    int L = c->num_layers, D = c->channels, H = c->hidden, hd = head_size(c), QKV = qkv_dim(c), KVD = kv_dim(c);
    if (D % 8 != 0 || H % 8 != 0 || !infer_detail::decode_attention_supports(hd)) {
        fatal("the GPU path needs D %d and H %d multiples of 8 and a head size (%d) of 16, 32, 64 or 128", D, H, hd);
    }
    if (cache_len < 1 || cache_len > c->max_seq_len) { fatal("cache length %d must be 1..%d", cache_len, c->max_seq_len); }
    m->max_seqs = max_seqs;
    m->max_rows = max_rows;
    m->cache_len = cache_len;
    m->ffn = INFER_FFN_TWELL;
    m->use_graph = 1;
    m->twell_min_rows = TWELL_PREFILL_MIN_ROWS;
    if (main_stream == 0) { cudaCheck(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking)); }
    size_t P = num_parameters(c);
    m->params = (bf16*)cuda_malloc(P * sizeof(bf16));
    size_t offsets[NUM_PARAM_TENSORS];
    param_offsets(offsets, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) { m->param[i] = m->params + offsets[i]; }
    size_t cache = (size_t)L * max_seqs * cache_len * KVD;
    m->k_cache = (bf16*)cuda_malloc(cache * sizeof(bf16));
    m->v_cache = (bf16*)cuda_malloc(cache * sizeof(bf16));
    size_t rows = max_rows > max_seqs ? max_rows : max_seqs;
    m->x = (bf16*)cuda_malloc(rows * D * sizeof(bf16));
    m->x_mid = (bf16*)cuda_malloc(rows * D * sizeof(bf16));
    m->normed = (bf16*)cuda_malloc(rows * D * sizeof(bf16));
    m->qkv = (bf16*)cuda_malloc(rows * QKV * sizeof(bf16));
    m->att = (bf16*)cuda_malloc(rows * D * sizeof(bf16));
    m->proj = (bf16*)cuda_malloc(rows * D * sizeof(bf16));
    m->gu = (bf16*)cuda_malloc(rows * 2 * H * sizeof(bf16));
    m->last = (bf16*)cuda_malloc((size_t)max_seqs * D * sizeof(bf16));
    m->logits = (bf16*)cuda_malloc((size_t)max_seqs * c->padded_vocab_size * sizeof(bf16));
    m->lse = (float*)cuda_malloc((size_t)max_rows * c->num_heads * sizeof(float));
    m->tokens = (int*)cuda_malloc(rows * sizeof(int));
    m->row_slot = (int*)cuda_malloc(rows * sizeof(int));
    m->row_pos = (int*)cuda_malloc(rows * sizeof(int));
    m->last_row = (int*)cuda_malloc((size_t)max_seqs * sizeof(int));
    m->active_list = (int*)cuda_malloc((size_t)max_seqs * H * sizeof(int));
    m->active_count = (int*)cuda_malloc((size_t)max_seqs * sizeof(int));
    m->active_a = (float*)cuda_malloc((size_t)max_seqs * H * sizeof(float));
    m->rho = (float*)cuda_malloc(L * sizeof(float));
    cudaCheck(cudaMallocHost(&m->logits_host, (size_t)max_seqs * c->padded_vocab_size * sizeof(uint16_t)));
    m->layer_active = (double*)mallocCheck(L * sizeof(double));
    for (int l = 0; l < L; l++) { m->layer_active[l] = -1.0; }
    m->sparse_prefill_ok = D % TWELL_D_MULTIPLE == 0;
    size_t splits = (size_t)max_seqs * c->num_heads * infer_detail::decode_splits(cache_len);
    m->part_o = (float*)cuda_malloc(splits * hd * sizeof(float));
    m->part_ml = (float*)cuda_malloc(splits * 2 * sizeof(float));
    m->splits_done = (int*)cuda_malloc((size_t)max_seqs * c->num_heads * sizeof(int));
    cudaCheck(cudaMemset(m->splits_done, 0, (size_t)max_seqs * c->num_heads * sizeof(int)));
    if ((size_t)H * sizeof(int) > 48 * 1024) {
        cudaCheck(cudaFuncSetAttribute(infer_detail::sparse_up_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)(H * sizeof(int))));
    }
    infer_detail::sparse_down_allow_smem(H);
}

static inline void gpu_model_free(GpuModel* m) {
    void* bufs[] = {m->params, m->k_cache, m->v_cache, m->x, m->x_mid, m->normed, m->qkv, m->att, m->proj, m->gu,
                    m->last, m->logits, m->lse, m->tokens, m->row_slot, m->row_pos, m->last_row, m->active_list,
                    m->active_count, m->active_a, m->rho, m->part_o, m->part_ml, m->splits_done};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { cuda_free(bufs[i]); }
    cudaCheck(cudaFreeHost(m->logits_host));
    if (m->twell_rows) { twell_ffn_free(&m->twell); }
    if (m->graph) { cudaCheck(cudaGraphExecDestroy(m->graph)); }
    free(m->layer_active);
    memset(m, 0, sizeof(*m));
}

// the weights from fp32 (a checkpoint's), rounded to bf16 on the GPU
static inline void gpu_model_upload(GpuModel* m, const float* params) {
    size_t P = num_parameters(&m->config), chunk = (size_t)1 << 26;
    float* staging = (float*)cuda_malloc((P < chunk ? P : chunk) * sizeof(float));
    for (size_t off = 0; off < P; off += chunk) {
        size_t n = P - off < chunk ? P - off : chunk;
        cudaCheck(cudaMemcpyAsync(staging, params + off, n * sizeof(float), cudaMemcpyHostToDevice, main_stream));
        infer_detail::float_to_bf16_kernel<<<1024, 256, 0, main_stream>>>(m->params + off, staging, n);
        cudaCheck(cudaGetLastError());
    }
    cudaCheck(cudaStreamSynchronize(main_stream));
    cuda_free(staging);
}

// A random model (every matrix N(0, 0.02), norms 1) with the synthetic-sparse
// carrier of the top of this file when k > 0; the gate offsets are set by the
// next prefill (gpu_model_prefill calibrates while m->calibrate_k > 0).
static inline void gpu_model_init_synthetic(GpuModel* m, uint32_t seed, double k) {
    using namespace infer_detail;
    const GPTConfig* c = &m->config;
    int L = c->num_layers, D = c->channels, H = c->hidden, QKV = qkv_dim(c);
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (param_is_matrix(i)) {
            fill_normal_kernel<<<4096, 256, 0, main_stream>>>(m->param[i], sizes[i], 0.02f, seed + 7919u * i);
            cudaCheck(cudaGetLastError());
        } else {
            set_column_kernel<<<ceil_div((int)sizes[i], 256), 256, 0, main_stream>>>(m->param[i], (int)sizes[i], 1, 0, 1.0f);
            cudaCheck(cudaGetLastError());
        }
    }
    size_t real = (size_t)c->vocab_size * D;
    cudaCheck(cudaMemsetAsync(m->param[P_WTE] + real, 0, (sizes[P_WTE] - real) * sizeof(bf16), main_stream));
    m->calibrate_k = k;
    if (k <= 0) { return; }
    auto column = [&](bf16* x, int rows, float value) {
        set_column_kernel<<<ceil_div(rows, 256), 256, 0, main_stream>>>(x, rows, D, D - 1, value);
        cudaCheck(cudaGetLastError());
    };
    column(m->param[P_WTE], c->vocab_size, 0.02f);
    for (int l = 0; l < L; l++) {
        cudaCheck(cudaMemsetAsync(m->param[P_WO] + ((size_t)l * D + D - 1) * D, 0, D * sizeof(bf16), main_stream));
        column(m->param[P_WQKV] + (size_t)l * QKV * D, QKV, 0.0f);
        column(m->param[P_WU] + (size_t)l * H * D, H, 0.0f);
        column(m->param[P_WDT] + (size_t)l * H * D, H, 0.0f);
    }
    cudaCheck(cudaStreamSynchronize(main_stream));
}

// the FFN of layer l for M rows of m->normed into m->proj, by TwELL: grown and
// run again until its status says the output is exact
static inline void gpu_ffn_twell_prefill(GpuModel* m, int l, int M) {
    const GPTConfig* c = &m->config;
    int D = c->channels, H = c->hidden;
    size_t LH = (size_t)l * H * D;
    if (m->twell_rows != M) {
        if (m->twell_rows) { twell_ffn_free(&m->twell); }
        // first sizes for a trained model's activity; the status grows them when a layer needs more
        m->twell = twell_ffn_create(M, D, H, TWELL_TILE / 8 - 1, M > 1024 ? M : 1024);
        m->twell.choice = m->twell_choice;
        m->twell_rows = M;
        m->twell_dense_timed = 0;
    }
    TwellFFN* tw = &m->twell;
    for (;;) {
        tw->active_per_row = m->layer_active[l];
        // auto: the first layer at a new M runs dense once, so that the choice compares measured times
        // (twell_ffn_status keeps them), not the sparse time with an estimate of the dense one
        bool time_dense = tw->choice == TWELL_AUTO && !m->twell_dense_timed;
        if (time_dense) { tw->choice = TWELL_FORCE_DENSE; }
        twell_ffn_forward(tw, m->proj, m->normed, m->param[P_WG] + LH, m->param[P_WU] + LH, m->param[P_WDT] + LH, m->gu);
        if (time_dense) { tw->choice = TWELL_AUTO; m->twell_dense_timed = 1; }
        TwellStatus st = twell_ffn_status(tw);
        m->layer_active[l] = st.active_per_row;
        if (st.ok) { return; }
        // grow to what the status asked for (with room), keeping what the path choice learnt
        long long records = st.records_needed + st.records_needed / 4 + 1;
        if (records < tw->tw.record_capacity) { records = tw->tw.record_capacity; }
        if (records > INT_MAX) { fatal("twell: %lld records are too many", records); }
        double dense_above = tw->dense_above;
        float ms_gate = tw->ms_gate, ms_dense = tw->ms_dense, ms_per_active = tw->ms_per_active;
        TwellChoice choice = tw->choice;
        twell_ffn_free(tw);
        *tw = twell_ffn_create(M, D, H, TWELL_TILE / 8 - 1, (int)records);
        tw->dense_above = dense_above;
        tw->ms_gate = ms_gate;
        tw->ms_dense = ms_dense;
        tw->ms_per_active = ms_per_active;
        tw->choice = choice;
        m->regrows++;
    }
}

// the transformer over M rows whose tokens, slots and positions are on the
// device, leaving each layer's FFN to `ffn`; ends with m->normed = final norm
template <typename FFN>
static void gpu_model_layers(GpuModel* m, int M, FFN ffn, const int* seq_rows, const int* seq_lens, int nseq,
                             bool decode) {
    const GPTConfig* c = &m->config;
    int L = c->num_layers, D = c->channels, QKV = qkv_dim(c), NH = c->num_heads, NKV = c->num_kv_heads;
    int hd = head_size(c), KVD = kv_dim(c);
    size_t cache_layer = (size_t)m->max_seqs * m->cache_len * KVD;
    encoder_forward(m->x, m->tokens, m->param[P_WTE], M, D);
    rmsnorm_forward(m->normed, NULL, m->x, m->param[P_ATTN_NORM], M, D, c->norm_eps, decode);
    for (int l = 0; l < L; l++) {
        bf16* kc = m->k_cache + l * cache_layer;
        bf16* vc = m->v_cache + l * cache_layer;
        const bf16* wqkv = m->param[P_WQKV] + (size_t)l * QKV * D;
        if (decode) { infer_detail::decode_linear(m->qkv, m->normed, wqkv, M, QKV, D); }
        else { gemm(m->qkv, m->normed, wqkv, M, QKV, D, 0, 1, 0); }
        if (decode) {
            infer_detail::decode_attention(m->att, m->part_o, m->part_ml, m->splits_done, m->qkv, kc, vc, m->row_pos,
                                           M, NH, NKV, hd, m->cache_len, c->rope_theta);
        } else {
            infer_detail::rope_cache_kernel<<<ceil_div(M * (hd / 2), 256), 256, 0, main_stream>>>(
                m->qkv, kc, vc, m->row_slot, m->row_pos, M, NH, NKV, hd, m->cache_len, c->rope_theta);
            cudaCheck(cudaGetLastError());
            // a prompt starts at position 0: causal attention over its own rows; consecutive prompts
            // of one length go as one batch (16 launches of 1024 rows took 0.37 ms per layer)
            for (int s = 0, e; s < nseq; s = e) {
                for (e = s + 1; e < nseq && seq_lens[e] == seq_lens[s]; e++) {}
                attention_forward(m->att + (size_t)seq_rows[s] * D, m->lse, m->qkv + (size_t)seq_rows[s] * QKV, e - s,
                                  seq_lens[s], NH, NKV, hd);
            }
        }
        const bf16* wo = m->param[P_WO] + (size_t)l * D * D;
        if (decode) { infer_detail::decode_linear(m->proj, m->att, wo, M, D, D); }
        else { gemm(m->proj, m->att, wo, M, D, D, 0, 1, 0); }
        fused_residual_rmsnorm_forward(m->x_mid, m->normed, NULL, m->x, m->proj, m->param[P_FFN_NORM] + (size_t)l * D,
                                       M, D, c->norm_eps, decode);
        ffn(l);
        int last = l == L - 1;
        fused_residual_rmsnorm_forward(m->x, m->normed, NULL, m->x_mid, m->proj,
                                       last ? m->param[P_FINAL_NORM] : m->param[P_ATTN_NORM] + (size_t)(l + 1) * D, M,
                                       D, c->norm_eps, decode);
    }
}

// the dense FFN of layer l over M rows
static inline void gpu_ffn_dense(GpuModel* m, int l, int M) {
    const GPTConfig* c = &m->config;
    size_t LH = (size_t)l * c->hidden * c->channels;
    ffn_dense_forward(m->proj, m->gu, m->gu + (size_t)M * c->hidden, m->normed, m->param[P_WG] + LH,
                      m->param[P_WU] + LH, m->param[P_WDT] + LH, M, c->channels, c->hidden, NULL);
}

// the dense decode FFN of layer l over B rows: g and u by the decode GEMV, h = relu(g) u, y = h WdT (cuBLASLt)
static inline void gpu_ffn_dense_decode(GpuModel* m, int l, int B) {
    const GPTConfig* c = &m->config;
    int D = c->channels, H = c->hidden;
    size_t LH = (size_t)l * H * D;
    bf16 *g = m->gu, *u = m->gu + (size_t)B * H;
    infer_detail::decode_linear(g, m->normed, m->param[P_WG] + LH, B, H, D);
    infer_detail::decode_linear(u, m->normed, m->param[P_WU] + LH, B, H, D);
    relu_mul(g, g, u, (size_t)B * H, NULL);
    gemm(m->proj, g, m->param[P_WDT] + LH, B, D, H, 0, 0, 0);
}

// the sparse decode FFN of layer l over B rows (one per sequence): y = sum over
// each row's active units only (see the top of the file)
static inline void gpu_ffn_sparse_decode(GpuModel* m, int l, int B) {
    using namespace infer_detail;
    const GPTConfig* c = &m->config;
    int D = c->channels, H = c->hidden;
    size_t LH = (size_t)l * H * D;
    const bf16 *wg = m->param[P_WG] + LH, *wu = m->param[P_WU] + LH, *wdT = m->param[P_WDT] + LH;
    dim3 down_grid(ceil_div(D, SPARSE_DOWN_COLS), B);
    if (gemv_fits(B, D)) {
        gemv(GateUpRow{m->active_a, wu, D, H}, m->normed, wg, B, H, D);
        launch_early(sparse_down_active_kernel, down_grid, SPARSE_THREADS, sparse_down_smem(H), m->proj, m->active_a,
                     wdT, D, H);
        return;
    }
    gemm(m->gu, m->normed, wg, B, H, D, 0, 1, 0);
    sparse_up_kernel<<<dim3(SPARSE_UP_BLOCKS, B), SPARSE_THREADS, H * sizeof(int), main_stream>>>(
        m->active_a, m->active_list, m->active_count, m->gu, m->normed, wu, D, H);
    cudaCheck(cudaGetLastError());
    sparse_down_kernel<<<down_grid, SPARSE_THREADS, sparse_down_smem(H), main_stream>>>(
        m->proj, m->active_a, m->active_list, m->active_count, wdT, D, H);
    cudaCheck(cudaGetLastError());
}

// logits of the first n rows of m->last into host floats [n, Vp]
static inline void gpu_model_logits(GpuModel* m, int n, float* logits) {
    const GPTConfig* c = &m->config;
    size_t count = (size_t)n * c->padded_vocab_size;
    cudaCheck(cudaMemcpyAsync(m->logits_host, m->logits, count * sizeof(bf16), cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    for (size_t i = 0; i < count; i++) { logits[i] = float_from_bf16(m->logits_host[i]); }
}

// Prefill: prompt s (tokens[off_s .. off_s + lens[s]), concatenated) fills
// cache slot s from position 0. logits (host, [nseq, Vp], may be NULL) gets
// each prompt's last-token logits.
static inline void gpu_model_prefill(GpuModel* m, const int* tokens, const int* lens, int nseq, float* logits) {
    using namespace infer_detail;
    const GPTConfig* c = &m->config;
    if (nseq < 1 || nseq > m->max_seqs) { fatal("prefill of %d prompts, the model holds 1 to %d", nseq, m->max_seqs); }
    int M = 0;
    int* seq_rows = (int*)mallocCheck(nseq * sizeof(int));
    for (int s = 0; s < nseq; s++) {
        if (lens[s] < 1 || lens[s] > m->cache_len) { fatal("prompt %d has %d tokens, the cache holds 1 to %d", s, lens[s], m->cache_len); }
        seq_rows[s] = M;
        M += lens[s];
    }
    if (M > m->max_rows) { fatal("prefill of %d tokens, the model was sized for %d", M, m->max_rows); }
    int* host = (int*)mallocCheck((size_t)3 * M * sizeof(int) + nseq * sizeof(int));
    int *slot = host + M, *pos = host + 2 * M, *last = host + 3 * M;
    memcpy(host, tokens, M * sizeof(int));
    for (int s = 0; s < nseq; s++) {
        for (int t = 0; t < lens[s]; t++) { slot[seq_rows[s] + t] = s; pos[seq_rows[s] + t] = t; }
        last[s] = seq_rows[s] + lens[s] - 1;
    }
    cudaCheck(cudaMemcpyAsync(m->tokens, host, M * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(m->row_slot, slot, M * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(m->row_pos, pos, M * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(m->last_row, last, nseq * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    bool sparse = m->ffn == INFER_FFN_TWELL && m->sparse_prefill_ok && m->calibrate_k <= 0 && M >= m->twell_min_rows;
    double t_k = m->calibrate_k > 0 ? normal_quantile(1.0 - m->calibrate_k / c->hidden) : 0;
    gpu_model_layers(m, M, [&](int l) {
        if (m->calibrate_k > 0) { // the synthetic gate offsets of this layer, from its input
            size_t LH = (size_t)l * c->hidden * c->channels;
            carrier_ratio_kernel<<<1, 1024, 0, main_stream>>>(m->rho + l, m->normed, M, c->channels);
            cudaCheck(cudaGetLastError());
            gate_offset_kernel<<<ceil_div(c->hidden, 8), 256, 0, main_stream>>>(m->param[P_WG] + LH, m->rho + l,
                                                                                c->hidden, c->channels, (float)t_k);
            cudaCheck(cudaGetLastError());
        }
        if (sparse) { gpu_ffn_twell_prefill(m, l, M); } else { gpu_ffn_dense(m, l, M); }
    }, seq_rows, lens, nseq, false);
    m->calibrate_k = 0;
    gather_rows_kernel<<<nseq, 128, 0, main_stream>>>(m->last, m->normed, m->last_row, nseq, c->channels);
    cudaCheck(cudaGetLastError());
    gemm(m->logits, m->last, m->param[P_WTE], nseq, c->padded_vocab_size, c->channels, 0, 1, 0);
    if (logits) { gpu_model_logits(m, nseq, logits); } else { cudaCheck(cudaStreamSynchronize(main_stream)); }
    free(host);
    free(seq_rows);
}

// one decode step of B sequences as queued work (what the graph holds)
static inline void gpu_decode_body(GpuModel* m, int B, InferFFN ffn) {
    const GPTConfig* c = &m->config;
    gpu_model_layers(m, B, [&](int l) {
        if (ffn == INFER_FFN_TWELL) { gpu_ffn_sparse_decode(m, l, B); } else { gpu_ffn_dense_decode(m, l, B); }
    }, NULL, NULL, B, true);
    infer_detail::decode_linear(m->logits, m->normed, m->param[P_WTE], B, c->padded_vocab_size, c->channels);
}

// Decode: sequence s (cache slot s) gets tokens[s] at position pos[s] (its
// cache holds 0..pos[s]-1); logits (host, [B, Vp], may be NULL) gets the next-token logits.
static inline void gpu_model_decode(GpuModel* m, const int* tokens, const int* pos, int B, float* logits) {
    if (B < 1 || B > m->max_seqs) { fatal("decode of %d sequences, the model holds 1 to %d", B, m->max_seqs); }
    for (int s = 0; s < B; s++) {
        if (pos[s] < 0 || pos[s] >= m->cache_len) { fatal("decode at position %d, the cache holds 0 to %d", pos[s], m->cache_len - 1); }
    }
    cudaCheck(cudaMemcpyAsync(m->tokens, tokens, B * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    cudaCheck(cudaMemcpyAsync(m->row_pos, pos, B * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    if (!m->use_graph) {
        gpu_decode_body(m, B, m->ffn);
    } else {
        if (m->graph == NULL || m->graph_seqs != B || m->graph_ffn != m->ffn) {
            if (m->graph) { cudaCheck(cudaGraphExecDestroy(m->graph)); m->graph = NULL; }
            gpu_decode_body(m, B, m->ffn); // a run outside the capture: cuBLASLt picks its algorithms here
            cudaGraph_t graph;
            cudaCheck(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeThreadLocal));
            gpu_decode_body(m, B, m->ffn);
            cudaCheck(cudaStreamEndCapture(main_stream, &graph));
            cudaCheck(cudaGraphInstantiate(&m->graph, graph, 0));
            cudaCheck(cudaGraphDestroy(graph));
            m->graph_seqs = B;
            m->graph_ffn = m->ffn;
        }
        cudaCheck(cudaGraphLaunch(m->graph, main_stream));
    }
    if (logits) { gpu_model_logits(m, B, logits); } else { cudaCheck(cudaStreamSynchronize(main_stream)); }
}

#endif // LLMC_CUDA_INFER_CUH
