/*
 Attention over a key/value cache on the GPU, for inference: the prefill of a
 batch of prompts and the decode step of a batch of sequences, with RoPE and
 the cache writes. The math is attention's (llmc/cuda_attention.cuh) and
 RoPE's (llmc/cuda_rope.cuh); the CPU reference is attention_forward_cached of
 llmc/cpu_ops.h. One layer's cache is [slots, cache_len, NKV hd], keys after
 RoPE; row m of a call is position pos[m] of the sequence in cache slot
 slot[m] (device arrays, filled by the host before the call).

 Prefill: RoPE at each row's own position (the rope_kernel's angle and
 rounding), then the row's k and v into the cache of its sequence. One thread
 per (row, 8 consecutive pairs), as rope_kernel: the angles once, then those
 pairs of every q and k head, in 16-byte accesses (a thread per head computed
 each angle 64 times over; a thread per pair made 2-byte accesses). A prompt
 that starts at position 0 then attends causally over its own rows with the
 training kernels; consecutive such prompts of one length go as one batch (one
 launch instead of one per prompt). A chunk of a longer prompt (a server's
 prefill in pieces: it starts past position 0) attends over its sequence's
 cache instead, which now holds its own rows too: chunk_attention_kernel,
 a block per head and CHUNK_ROWS consecutive rows, keys and values brought
 into shared memory CHUNK_KEYS positions at a time for all of its rows, an
 online softmax in fp32 per row (flash attention's order, on CUDA cores).

 Decode, split over the cache (flash-decoding), RoPE included: the new row's q
 and k (in qkv, not yet turned) are turned at position pos[b] here
 (rope_angle/rope_turn, the bits of the prefill's RoPE), the new key and value
 are taken from qkv, and the first q head of each kv head's group stores them
 in the cache for later steps (one kernel less per layer). Block (head h,
 sequence b, split j) takes positions 128 j .. 128 j + 127 (those <= pos[b]);
 thread (g, e) copies the 16-byte piece e of the keys and values of rows g,
 g + G, .. (DECODE_ROWS of them) into shared memory by cp.async before the
 wait for qkv (so the split's 32 KB are in flight while the kernel before
 ends; registers would hold a third as many bytes an SM), and reads back only
 the pieces it copied: no barrier waits on the loads. A row's score is
 its pieces' products summed over the row's threads by shuffles; each thread
 keeps the partial softmax of its rows (max m, l = sum exp(s - m),
 o = sum exp(s - m) v over its 8 dimensions), merged over the threads of its
 piece by shuffles, then over the warps, in a fixed order. The sequence's
 cache is that of slot[b], and row b's split scratch is its own; the split
 leaves its m_j, l_j and o_j. The last of a head's splits to finish (a
 counter per head and sequence) combines them, in split order:
     m = max_j m_j,  out = sum_j exp(m_j - m) o_j / sum_j exp(m_j - m) l_j
 (a cache of one split writes out = o_0 / l_0 at once: the same bits). So a
 long cache spreads over many SMs, and a sequence's bits do not depend on the
 batch around it (the splits are fixed by position). Head sizes 16, 32, 64
 and 128.
*/
#ifndef LLMC_CUDA_ATTENTION_CACHED_CUH
#define LLMC_CUDA_ATTENTION_CACHED_CUH

#include <math.h>
#include "llmc/cuda_attention.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/cuda_rope.cuh"

namespace attention_detail {

// ----------------------------------------------------------------------------
// prefill: RoPE and the cache writes (see the top of the file)
template <int VEC>
__global__ void rope_cache_kernel(bf16* qkv, bf16* k_cache, bf16* v_cache, const int* row_slot, const int* row_pos,
                                  int M, int NH, int NKV, int hd, int cache_len, float theta) {
    const int half = hd / 2, groups = half / VEC, KVD = NKV * hd;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)M * groups) { return; }
    const int m = (int)(idx / groups), i0 = (int)(idx % groups) * VEC, pos = row_pos[m];
    float sin_a[VEC], cos_a[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; v++) { rope_angle(pos, i0 + v, hd, theta, &sin_a[v], &cos_a[v]); }
    bf16* x = qkv + (size_t)m * (NH + 2 * NKV) * hd + i0;
    bf16 *kc = k_cache + ((size_t)row_slot[m] * cache_len + pos) * KVD + i0, *vc = v_cache + (kc - k_cache);
    #pragma unroll 4
    for (int h = 0; h < NH + NKV; h++) {
        bf16* xh = x + h * hd;
        rope_turn_head<VEC>(xh, half, sin_a, cos_a);
        if (h >= NH) {
            const int c = (h - NH) * hd;
            typedef Bf16Vec<VEC> V;
            *(V*)(kc + c) = *(V*)xh;
            *(V*)(kc + c + half) = *(V*)(xh + half);
            *(V*)(vc + c) = *(V*)(xh + KVD);
            *(V*)(vc + c + half) = *(V*)(xh + KVD + half);
        }
    }
}

// ----------------------------------------------------------------------------
// decode (see the top of the file)
constexpr int DECODE_SPLIT = 128; // positions per split
constexpr int DECODE_ROWS = 8;    // positions per thread (ROWS below)

// a thread per 16-byte piece of a row and ROWS of the split's rows: 128 threads at head size 64 and 8 rows
template <int HD, int ROWS> __host__ __device__ constexpr int decode_threads() { return DECODE_SPLIT / ROWS * (HD / 8); }

// out[b, h] from the `used` splits of (b, h), a thread per output dimension; the
// splits' loads unrolled so that they are in flight together
__device__ void decode_attention_combine(bf16* out, const float* part_o, const float* part_ml, int b, int h, int NH,
                                         int hd, int splits, int used) {
    const size_t first = ((size_t)b * NH + h) * splits;
    float m = -INFINITY;
    #pragma unroll 8
    for (int j = 0; j < used; j++) { m = fmaxf(m, part_ml[2 * (first + j)]); }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float l = 0.0f, o = 0.0f;
        #pragma unroll 8
        for (int j = 0; j < used; j++) {
            const float w = expf(part_ml[2 * (first + j)] - m);
            l += w * part_ml[2 * (first + j) + 1];
            o += w * part_o[(first + j) * hd + d];
        }
        out[(size_t)b * NH * hd + h * hd + d] = __float2bfloat16_rn(o / l);
    }
}

// A partial softmax over some positions: the max score m, l = sum exp(s - m) and
// o = sum exp(s - m) v over N of the head's dimensions; (m, l, o) merged with
// (m2, l2, o2) in the order the caller fixes (an empty part has m = -inf, l = 0, o = 0)
template <int N>
__device__ __forceinline__ void softmax_part_merge(float* m, float* l, float* o, float m2, float l2, const float* o2) {
    const float mx = fmaxf(*m, m2);
    if (mx == -INFINITY) { return; } // both empty
    const float w = expf(*m - mx), w2 = expf(m2 - mx); // exp(-inf) = 0 for an empty one
    *m = mx;
    *l = *l * w + l2 * w2;
    #pragma unroll
    for (int k = 0; k < N; k++) { o[k] = o[k] * w + o2[k] * w2; }
}

// a thread's partial softmax over its 8 dimensions (softmax_part_merge's m, l, o)
struct DecodePart {
    float m, l, o[8];
};

template <int HD, int ROWS>
__global__ void __launch_bounds__(decode_threads<HD, ROWS>())
decode_attention_split_kernel(bf16* out, float* part_o, float* part_ml, int* splits_done, const bf16* qkv,
                              bf16* k_cache, bf16* v_cache, const int* slot, const int* pos, int NH, int NKV,
                              int cache_len, int splits, float scale, float theta) {
    constexpr int PIECES = HD / 8, THREADS = decode_threads<HD, ROWS>(), WARPS = THREADS / 32, HALF = HD / 2;
    constexpr int GROUPS = DECODE_SPLIT / ROWS; // threads on one piece of the split's rows
    __shared__ __align__(16) float q[HD];
    __shared__ __align__(16) bf16 k_new[HD]; // the new position's key, turned
    __shared__ DecodePart warp_part[WARPS][PIECES];
    const int h = blockIdx.x, b = blockIdx.y, j = blockIdx.z, tid = threadIdx.x;
    // pos and slot come from the host before the step and the cache before the new
    // position n - 1 from earlier steps: all are read before waiting for the kernels
    // before this one (which write qkv), and so is the angle
    const int n = pos[b] + 1, t0 = j * DECODE_SPLIT, KVD = NKV * HD, kvh = h / (NH / NKV);
    if (t0 >= n) { return; } // the whole block: past this sequence's end
    const int t_new = n - 1 - t0; // the new position's row in this split (>= DECODE_SPLIT: another split's)
    const size_t seq = (size_t)slot[b] * cache_len;
    // thread (g, e) takes piece e (dimensions 8 e .. 8 e + 7) of rows g, g + GROUPS, ...: consecutive
    // threads read one row's consecutive 16 bytes, so a warp reads whole rows
    const int e = tid % PIECES, g = tid / PIECES;
    const bf16* kb = k_cache + seq * KVD + kvh * HD + e * 8;
    const bf16* vb = v_cache + seq * KVD + kvh * HD + e * 8;
    extern __shared__ __align__(16) bf16 kv[];
    bf16 *ks = kv + e * 8, *vs = kv + DECODE_SPLIT * HD + e * 8; // the split's rows [DECODE_SPLIT][HD]; this piece
    #pragma unroll
    for (int i = 0; i < ROWS; i++) { // rows past the cached ones (the new one, the end) come as zeros
        const int t = g + i * GROUPS;
        const size_t at = t < t_new ? (size_t)(t0 + t) * KVD : 0;
        cp_async_16(ks + t * HD, kb + at, t < t_new);
        cp_async_16(vs + t * HD, vb + at, t < t_new);
    }
    cp_async_commit();
    float sin_a = 0.0f, cos_a = 0.0f;
    if (tid < HALF) { rope_angle(n - 1, tid, HD, theta, &sin_a, &cos_a); }
    grid_dependents_launch();
    grid_dependency_wait();
    const bf16* row = qkv + (size_t)b * (NH + 2 * NKV) * HD;
    const bf16 *k_row = row + (NH + kvh) * HD, *v_row = row + (NH + NKV + kvh) * HD;
    const bool has_new = t_new < DECODE_SPLIT;
    if (tid < HALF) {
        bf16 r1, r2;
        rope_turn(&r1, &r2, __bfloat162float(row[h * HD + tid]), __bfloat162float(row[h * HD + tid + HALF]), sin_a, cos_a);
        q[tid] = __bfloat162float(r1) * scale;
        q[tid + HALF] = __bfloat162float(r2) * scale;
        if (has_new) { // the new position's key (turned) and value, into the block's rows and the cache
            rope_turn(&k_new[tid], &k_new[tid + HALF], __bfloat162float(k_row[tid]), __bfloat162float(k_row[tid + HALF]),
                      sin_a, cos_a);
            if (h % (NH / NKV) == 0) {
                const size_t c = (seq + n - 1) * KVD + kvh * HD + tid;
                k_cache[c] = k_new[tid];
                k_cache[c + HALF] = k_new[tid + HALF];
                v_cache[c] = v_row[tid];
                v_cache[c + HALF] = v_row[tid + HALF];
            }
        }
    }
    __syncthreads();
    float qe[8];
    #pragma unroll
    for (int k = 0; k < 8; k++) { qe[k] = q[e * 8 + k]; }
    cp_async_wait<0>(); // the thread reads only the pieces it copied: no barrier
    // the scores of the thread's rows: its piece's products, summed over the row's PIECES threads
    float s[ROWS];
    #pragma unroll
    for (int i = 0; i < ROWS; i++) {
        const int t = g + i * GROUPS;
        const Bf16x8 k = load_bf16x8(t == t_new ? k_new + e * 8 : ks + t * HD);
        float dot = 0.0f;
        #pragma unroll
        for (int c = 0; c < 8; c++) { dot += qe[c] * __bfloat162float(k.v[c]); }
        #pragma unroll
        for (int off = 1; off < PIECES; off *= 2) { dot += __shfl_xor_sync(0xffffffffu, dot, off); }
        s[i] = t <= t_new ? dot : -INFINITY;
    }
    DecodePart part;
    part.m = -INFINITY;
    #pragma unroll
    for (int i = 0; i < ROWS; i++) { part.m = fmaxf(part.m, s[i]); }
    part.l = 0.0f;
    #pragma unroll
    for (int k = 0; k < 8; k++) { part.o[k] = 0.0f; }
    if (part.m != -INFINITY) { // past the end every row of the thread: nothing
        #pragma unroll
        for (int i = 0; i < ROWS; i++) {
            const int t = g + i * GROUPS;
            const Bf16x8 v = load_bf16x8(t == t_new ? v_row + e * 8 : vs + t * HD);
            const float p = expf(s[i] - part.m);
            part.l += p;
            #pragma unroll
            for (int k = 0; k < 8; k++) { part.o[k] += p * __bfloat162float(v.v[k]); }
        }
    }
    // merged over the warp's threads of piece e (lanes e, e + PIECES, ...), then over the warps, in order
    #pragma unroll
    for (int off = PIECES; off < 32; off *= 2) {
        DecodePart other;
        other.m = __shfl_xor_sync(0xffffffffu, part.m, off);
        other.l = __shfl_xor_sync(0xffffffffu, part.l, off);
        #pragma unroll
        for (int k = 0; k < 8; k++) { other.o[k] = __shfl_xor_sync(0xffffffffu, part.o[k], off); }
        softmax_part_merge<8>(&part.m, &part.l, part.o, other.m, other.l, other.o);
    }
    if (tid % 32 < PIECES) { warp_part[tid / 32][e] = part; }
    __syncthreads();
    const size_t split = ((size_t)b * NH + h) * splits + j;
    const int used = (n - 1) / DECODE_SPLIT + 1;
    if (tid < HD) { // a thread per output dimension d = 8 e' + k
        const int ed = tid / 8, k = tid % 8;
        float m = warp_part[0][ed].m, l = warp_part[0][ed].l, o = warp_part[0][ed].o[k];
        #pragma unroll
        for (int w = 1; w < WARPS; w++) {
            softmax_part_merge<1>(&m, &l, &o, warp_part[w][ed].m, warp_part[w][ed].l, &warp_part[w][ed].o[k]);
        }
        if (used == 1) { out[(size_t)b * NH * HD + h * HD + tid] = __float2bfloat16_rn(o / l); } // the combine's bits
        else { part_o[split * HD + tid] = o; }
        if (tid == 0 && used > 1) { part_ml[2 * split] = m; part_ml[2 * split + 1] = l; }
    }
    if (used == 1) { return; } // the only split: nothing to combine
    if (block_arrives_last(splits_done + (size_t)b * NH + h, used)) { // the last split combines
        decode_attention_combine(out, part_o, part_ml, b, h, NH, HD, splits, used);
    }
}

template <int HD, int ROWS = DECODE_ROWS>
static void decode_attention_launch(dim3 grid, bf16* out, float* part_o, float* part_ml, int* splits_done,
                                    const bf16* qkv, bf16* k_cache, bf16* v_cache, const int* slot, const int* pos,
                                    int NH, int NKV, int cache_len, int splits, float theta) {
    const size_t smem = 2 * DECODE_SPLIT * HD * sizeof(bf16); // 64 KB at HD 128: past the default 48
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(decode_attention_split_kernel<HD, ROWS>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        prefer_shared_memory(decode_attention_split_kernel<HD, ROWS>);
        configured = true;
    }
    launch_early(decode_attention_split_kernel<HD, ROWS>, grid, decode_threads<HD, ROWS>(), smem, out, part_o, part_ml, splits_done,
                 qkv, k_cache, v_cache, slot, pos, NH, NKV, cache_len, splits, 1.0f / sqrtf((float)HD), theta);
}

// ----------------------------------------------------------------------------
// a prefill chunk that starts past position 0 (see the top of the file)
constexpr int CHUNK_ROWS = 16, CHUNK_KEYS = 32; // rows of a block; key positions per tile (a lane each)
constexpr int CHUNK_THREADS = 128;

// a key row padded by 16 bytes in shared memory, so that the threads of a quarter
// warp, each reading its own key, hit every bank
template <int HD> __host__ __device__ constexpr int chunk_key_stride() { return HD + 8; }

// Block (head h, rows row0 + CHUNK_ROWS y ..): rows of one chunk, so of one
// sequence at consecutive positions; q already turned (rope_cache_kernel),
// the cache already holding the chunk's own keys and values
template <int HD>
__global__ void __launch_bounds__(CHUNK_THREADS)
chunk_attention_kernel(bf16* out, const bf16* qkv, const bf16* k_cache, const bf16* v_cache, const int* row_slot,
                       const int* row_pos, int row0, int rows, int NH, int NKV, int cache_len, float scale) {
    constexpr int KS = chunk_key_stride<HD>(), VECS = HD / 8, WARPS = CHUNK_THREADS / 32;
    __shared__ float q[CHUNK_ROWS][HD];
    __shared__ float o[CHUNK_ROWS][HD];
    __shared__ float p[CHUNK_ROWS][CHUNK_KEYS];
    __shared__ __align__(16) bf16 ks[CHUNK_KEYS * KS];
    __shared__ __align__(16) bf16 vs[CHUNK_KEYS * HD];
    __shared__ float m_run[CHUNK_ROWS], l_run[CHUNK_ROWS], alpha[CHUNK_ROWS];
    __shared__ int row_last[CHUNK_ROWS]; // each row's position: the last key it sees
    const int h = blockIdx.x, r0 = row0 + blockIdx.y * CHUNK_ROWS, tid = threadIdx.x, lane = tid % 32;
    const int nr = min(CHUNK_ROWS, row0 + rows - r0), KVD = NKV * HD, QKV = (NH + 2 * NKV) * HD, kvh = h / (NH / NKV);
    const size_t seq = (size_t)row_slot[r0] * cache_len;
    const bf16 *kb = k_cache + seq * KVD + kvh * HD, *vb = v_cache + seq * KVD + kvh * HD;
    const int last = row_pos[r0 + nr - 1]; // the block's last key position
    for (int i = tid; i < CHUNK_ROWS * HD; i += CHUNK_THREADS) {
        const int r = i / HD, d = i % HD;
        q[r][d] = r < nr ? __bfloat162float(qkv[(size_t)(r0 + r) * QKV + h * HD + d]) * scale : 0.0f;
        o[r][d] = 0.0f;
    }
    if (tid < CHUNK_ROWS) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.0f;
        row_last[tid] = tid < nr ? row_pos[r0 + tid] : -1;
    }
    for (int t0 = 0; t0 <= last; t0 += CHUNK_KEYS) {
        const int tile = min(CHUNK_KEYS, last + 1 - t0);
        __syncthreads(); // the last tile's readers are done (the first time: q, o and the rows are set)
        for (int i = tid; i < tile * VECS; i += CHUNK_THREADS) {
            const int t = i / VECS, e = (i % VECS) * 8;
            store_bf16x8(ks + t * KS + e, load_bf16x8(kb + (size_t)(t0 + t) * KVD + e));
            store_bf16x8(vs + t * HD + e, load_bf16x8(vb + (size_t)(t0 + t) * KVD + e));
        }
        __syncthreads();
        for (int i = tid; i < CHUNK_ROWS * CHUNK_KEYS; i += CHUNK_THREADS) { // the scores, causal per row
            const int r = i / CHUNK_KEYS, t = i % CHUNK_KEYS;
            float sc = -INFINITY;
            if (t < tile && t0 + t <= row_last[r]) {
                sc = 0.0f;
                #pragma unroll
                for (int c = 0; c < VECS; c++) {
                    const Bf16x8 k = load_bf16x8(ks + t * KS + c * 8);
                    #pragma unroll
                    for (int e = 0; e < 8; e++) { sc += q[r][c * 8 + e] * __bfloat162float(k.v[e]); }
                }
            }
            p[r][t] = sc;
        }
        __syncthreads();
        for (int r = tid / 32; r < CHUNK_ROWS; r += WARPS) { // a warp per row: the running max and sum
            const float sc = p[r][lane], mx = warp_reduce<Max>(sc), m_new = fmaxf(m_run[r], mx);
            const float pe = sc == -INFINITY ? 0.0f : expf(sc - m_new);
            p[r][lane] = pe;
            const float sum = warp_reduce<Sum>(pe);
            if (lane == 0) {
                const float a = m_run[r] == -INFINITY ? 0.0f : expf(m_run[r] - m_new);
                alpha[r] = a;
                l_run[r] = l_run[r] * a + sum;
                m_run[r] = m_new;
            }
        }
        __syncthreads();
        for (int i = tid; i < CHUNK_ROWS * HD; i += CHUNK_THREADS) { // o = alpha o + p v over the tile's keys
            const int r = i / HD, d = i % HD;
            float acc = o[r][d] * alpha[r];
            for (int t = 0; t < tile; t++) { acc += p[r][t] * __bfloat162float(vs[t * HD + d]); }
            o[r][d] = acc;
        }
    }
    __syncthreads();
    for (int i = tid; i < nr * HD; i += CHUNK_THREADS) {
        const int r = i / HD, d = i % HD;
        out[(size_t)(r0 + r) * NH * HD + h * HD + d] = __float2bfloat16_rn(o[r][d] / l_run[r]);
    }
}

template <int HD>
static void chunk_attention_launch(bf16* out, const bf16* qkv, const bf16* k_cache, const bf16* v_cache,
                                   const int* row_slot, const int* row_pos, int row0, int rows, int NH, int NKV,
                                   int cache_len) {
    const dim3 grid(NH, ceil_div(rows, CHUNK_ROWS));
    chunk_attention_kernel<HD><<<grid, CHUNK_THREADS, 0, main_stream>>>(out, qkv, k_cache, v_cache, row_slot, row_pos,
                                                                        row0, rows, NH, NKV, cache_len,
                                                                        1.0f / sqrtf((float)HD));
    cudaCheck(cudaGetLastError());
}

} // namespace attention_detail

// ----------------------------------------------------------------------------
// the overloads gpt.h calls (see the CPU templates in llmc/cpu_ops.h)

// the head sizes the decode attention is built for
static inline bool attention_decode_supports(int hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128; }

// splits of a cache of cache_len positions per (sequence, head) in a decode step
static inline int attention_decode_splits(int cache_len) { return ceil_div(cache_len, attention_detail::DECODE_SPLIT); }

// A decode step launches the splits of the positions its rows reach (longest = the largest pos[b] + 1), their
// count rounded up to a power of two: class c covers 2^c splits, so that a server's steps, whose longest row
// grows and shrinks as requests come and go, need a few CUDA graphs, and a step at 300 positions of a cache of
// 2048 does not launch 14 splits a head that would only exit (their blocks still pass through the SMs' slots)
static inline int attention_decode_class(int longest) {
    int c = 0;
    while ((attention_detail::DECODE_SPLIT << c) < longest) { c++; }
    return c;
}

// the positions class c covers in a cache of cache_len (the context argument of attention_decode)
static inline int attention_decode_context(int c, int cache_len) {
    const long long covered = (long long)attention_detail::DECODE_SPLIT << c;
    return covered < cache_len ? (int)covered : cache_len;
}

// the decode scratch of up to B sequences: part_o, part_ml of B NH splits (hd + 2) floats; splits_done, B NH
// zeros (each step leaves them zero)
static inline void attention_decode_alloc(float** part_o, float** part_ml, int** splits_done, int B, int NH, int hd,
                                          int cache_len) {
    size_t splits = (size_t)B * NH * attention_decode_splits(cache_len);
    *part_o = (float*)cuda_malloc(splits * hd * sizeof(float));
    *part_ml = (float*)cuda_malloc(splits * 2 * sizeof(float));
    *splits_done = (int*)cuda_malloc((size_t)B * NH * sizeof(int));
    cudaCheck(cudaMemset(*splits_done, 0, (size_t)B * NH * sizeof(int)));
}

// Prefill: out [M, NH hd] from qkv [M, QKV] (q and k turned here, in place);
// prompt s is rows seq_rows[s] .. seq_rows[s] + seq_lens[s] - 1 at positions
// seq_starts[s] .. (host arrays; seq_starts NULL: all 0) of its sequence, whose
// cache holds the positions before; lse [M, NH] is scratch
void attention_prefill(bf16* out, float* lse, bf16* qkv, bf16* k_cache, bf16* v_cache, const int* slot, const int* pos,
                       int M, const int* seq_rows, const int* seq_lens, const int* seq_starts, int nseq, int NH,
                       int NKV, int hd, int cache_len, float theta) {
    using namespace attention_detail;
    const int vec = rope_pairs_per_thread(hd);
    auto rope_cache = vec == 8 ? rope_cache_kernel<8> : rope_cache_kernel<1>;
    rope_cache<<<ceil_div(M * (hd / 2 / vec), 256), 256, 0, main_stream>>>(qkv, k_cache, v_cache, slot, pos, M, NH, NKV,
                                                                            hd, cache_len, theta);
    cudaCheck(cudaGetLastError());
    const int D = NH * hd, QKV = (NH + 2 * NKV) * hd;
    auto starts_at_0 = [&](int s) { return seq_starts == NULL || seq_starts[s] == 0; };
    for (int s = 0, e; s < nseq; s = e) {
        e = s + 1;
        if (!starts_at_0(s)) { // a chunk of a longer prompt: over its sequence's cache
            switch (hd) {
            case 16: chunk_attention_launch<16>(out, qkv, k_cache, v_cache, slot, pos, seq_rows[s], seq_lens[s], NH, NKV, cache_len); break;
            case 32: chunk_attention_launch<32>(out, qkv, k_cache, v_cache, slot, pos, seq_rows[s], seq_lens[s], NH, NKV, cache_len); break;
            case 64: chunk_attention_launch<64>(out, qkv, k_cache, v_cache, slot, pos, seq_rows[s], seq_lens[s], NH, NKV, cache_len); break;
            case 128: chunk_attention_launch<128>(out, qkv, k_cache, v_cache, slot, pos, seq_rows[s], seq_lens[s], NH, NKV, cache_len); break;
            default: fatal("prefill attention over a cache: head size %d, built for 16, 32, 64, 128", hd);
            }
            continue;
        }
        while (e < nseq && seq_lens[e] == seq_lens[s] && starts_at_0(e)) { e++; }
        attention_forward(out + (size_t)seq_rows[s] * D, lse, qkv + (size_t)seq_rows[s] * QKV, e - s, seq_lens[s], NH,
                          NKV, hd);
    }
}

// Decode: out [B, NH hd] from the new rows qkv [B, QKV] (q and k not yet
// turned) and the cache, where the new k and v go (position pos[b] of the
// sequence in cache slot slot[b]; every pos[b] < context <= cache_len: the
// splits launched cover context positions); part_o, part_ml, splits_done:
// attention_decode_alloc's
void attention_decode(bf16* out, float* part_o, float* part_ml, int* splits_done, const bf16* qkv, bf16* k_cache,
                      bf16* v_cache, const int* slot, const int* pos, int B, int NH, int NKV, int hd, int cache_len,
                      int context, float theta) {
    using namespace attention_detail;
    const int splits = attention_decode_splits(context);
    const dim3 grid(NH, B, splits);
    switch (hd) {
    case 16: decode_attention_launch<16>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, slot, pos, NH, NKV, cache_len, splits, theta); break;
    case 32: decode_attention_launch<32>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, slot, pos, NH, NKV, cache_len, splits, theta); break;
    case 64: decode_attention_launch<64>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, slot, pos, NH, NKV, cache_len, splits, theta); break;
    case 128: decode_attention_launch<128>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, slot, pos, NH, NKV, cache_len, splits, theta); break;
    default: fatal("decode attention: head size %d, built for 16, 32, 64, 128", hd);
    }
}

#endif // LLMC_CUDA_ATTENTION_CACHED_CUH
