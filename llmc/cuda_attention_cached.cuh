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
 sequence b, split j) takes positions 128 j .. 128 j + 127 (those <= pos[b]),
 warp w of its 4 the rows 32 w .. 32 w + 31, which it goes through without
 waiting for the other warps until their results are merged. Its lanes copy
 the rows' keys and values into shared memory by cp.async (consecutive lanes
 a row's consecutive 16 bytes) before the wait for qkv, so the split's bytes
 are in flight while the kernel before ends; the new position's turned key
 and its value go in from qkv. The products run on tensor cores (mma.sync
 m16n8k16, bf16 in, fp32 sums) with q in all 16 rows of A, although one row
 is used: on CUDA cores a block issued ~5,300 warp-instructions for its 32 KB
 (the 8 products and conversions of each 16-byte piece, the sums over a
 row's pieces by shuffles, the partial softmax merges), more than the SMs
 issue in the time the bytes take. s = q K^T (K's 8x8 blocks by ldmatrix,
 the rows' chunks stored permuted by decode_chunk so that they hit every
 bank), scaled in fp32; the warp's max m_w; p = exp(s - m_w) rounded to bf16
 as the A of o = p V (V's blocks transposed by ldmatrix), l_w = sum p. The
 warps' (m_w, l_w, o_w) merge in order (m = max m_w, weights exp(m_w - m)).
 The sequence's cache is that of slot[b], and row b's split scratch is its
 own; the split leaves its m_j, l_j and o_j. The last of a head's splits to
 finish (a counter per head and sequence) combines them, in split order:
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
constexpr int DECODE_WARPS = 4;   // a block's warps, each on DECODE_SPLIT / DECODE_WARPS of the split's rows
constexpr int DECODE_THREADS = DECODE_WARPS * 32;

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

// The split's rows [DECODE_SPLIT][HD] in shared memory as 16-byte chunks, chunk c of row t stored at
// q ^ ((q / L) % 8) where q = t HD / 8 + c and L = max(8, HD / 8): each row's chunks (from head size 64; below,
// each 128-byte line's) permuted by the row (the line), so that the 8 rows of one chunk an 8x8 ldmatrix reads
// and the 8 chunks that 8 lanes copy hit all 32 banks
template <int HD> __device__ __forceinline__ int decode_chunk(int t, int c) {
    constexpr int PIECES = HD / 8, LINE = PIECES > 8 ? PIECES : 8;
    const int q = t * PIECES + c;
    return q ^ ((q / LINE) & 7);
}

template <int HD>
__global__ void __launch_bounds__(DECODE_THREADS)
decode_attention_split_kernel(bf16* out, float* part_o, float* part_ml, int* splits_done, const bf16* qkv,
                              bf16* k_cache, bf16* v_cache, const int* slot, const int* pos, int NH, int NKV,
                              int cache_len, int splits, float scale, float theta) {
    constexpr int PIECES = HD / 8, HALF = HD / 2, PAIRS = (HALF + 31) / 32; // RoPE pairs a lane turns
    constexpr int ROWS = DECODE_SPLIT / DECODE_WARPS, KEY_TILES = ROWS / 8, DIM_TILES = HD / 8;
    __shared__ __align__(16) bf16 q[DECODE_WARPS][HD]; // each warp's own copy of q, turned
    __shared__ float warp_m[DECODE_WARPS], warp_l[DECODE_WARPS];
    __shared__ __align__(16) float warp_o[DECODE_WARPS][HD];
    const int h = blockIdx.x, b = blockIdx.y, j = blockIdx.z, tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    // pos and slot come from the host before the step and the cache before the new
    // position n - 1 from earlier steps: all are read before waiting for the kernels
    // before this one (which write qkv), and so are the angles
    const int n = pos[b] + 1, t0 = j * DECODE_SPLIT, KVD = NKV * HD, kvh = h / (NH / NKV);
    if (t0 >= n) { return; } // the whole block: past this sequence's end
    const int t_new = n - 1 - t0; // the new position's row in this split (>= DECODE_SPLIT: another split's)
    const int w0 = w * ROWS;      // the warp's rows w0 .. w0 + ROWS - 1
    const bool warp_in = w0 <= t_new, warp_has_new = warp_in && t_new < w0 + ROWS;
    const size_t seq = (size_t)slot[b] * cache_len;
    extern __shared__ __align__(16) bf16 kv[];
    bf16 *ks = kv, *vs = kv + DECODE_SPLIT * HD;
    // lane (r, e) copies piece e of the warp's rows r, r + 32 / PIECES, ..: consecutive lanes read one row's
    // consecutive 16 bytes, so a warp reads whole rows; the new row (written below from qkv) is not copied,
    // rows past it come as zeros
    if (warp_in) {
        const int e = lane % PIECES, r = lane / PIECES;
        const bf16* kb = k_cache + seq * KVD + kvh * HD + e * 8;
        const bf16* vb = v_cache + seq * KVD + kvh * HD + e * 8;
        #pragma unroll
        for (int i = 0; i < ROWS * PIECES / 32; i++) {
            const int t = w0 + r + i * (32 / PIECES);
            const size_t at = t < t_new ? (size_t)(t0 + t) * KVD : 0;
            if (t != t_new) {
                cp_async_16(ks + decode_chunk<HD>(t, e) * 8, kb + at, t < t_new);
                cp_async_16(vs + decode_chunk<HD>(t, e) * 8, vb + at, t < t_new);
            }
        }
    }
    cp_async_commit();
    float sin_a[PAIRS], cos_a[PAIRS];
    #pragma unroll
    for (int k = 0; k < PAIRS; k++) {
        if (lane + 32 * k < HALF) { rope_angle(n - 1, lane + 32 * k, HD, theta, &sin_a[k], &cos_a[k]); }
    }
    grid_dependents_launch();
    grid_dependency_wait();
    const bf16* row = qkv + (size_t)b * (NH + 2 * NKV) * HD;
    const bf16 *k_row = row + (NH + kvh) * HD, *v_row = row + (NH + NKV + kvh) * HD;
    #pragma unroll
    for (int k = 0; k < PAIRS; k++) {
        const int i = lane + 32 * k;
        if (i < HALF) {
            const float q1 = __bfloat162float(row[h * HD + i]), q2 = __bfloat162float(row[h * HD + i + HALF]);
            rope_turn(&q[w][i], &q[w][i + HALF], q1, q2, sin_a[k], cos_a[k]);
            if (warp_has_new) { // the new position's key (turned) and value, into the warp's rows and the cache
                const float k1 = __bfloat162float(k_row[i]), k2 = __bfloat162float(k_row[i + HALF]);
                const bf16 v1 = v_row[i], v2 = v_row[i + HALF];
                bf16 kn1, kn2;
                rope_turn(&kn1, &kn2, k1, k2, sin_a[k], cos_a[k]);
                ks[decode_chunk<HD>(t_new, i / 8) * 8 + i % 8] = kn1;
                ks[decode_chunk<HD>(t_new, (i + HALF) / 8) * 8 + i % 8] = kn2;
                vs[decode_chunk<HD>(t_new, i / 8) * 8 + i % 8] = v1;
                vs[decode_chunk<HD>(t_new, (i + HALF) / 8) * 8 + i % 8] = v2;
                if (h % (NH / NKV) == 0) {
                    const size_t c = (seq + n - 1) * KVD + kvh * HD + i;
                    k_cache[c] = kn1;
                    k_cache[c + HALF] = kn2;
                    v_cache[c] = v1;
                    v_cache[c + HALF] = v2;
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncwarp(); // the warp's rows and q: the warps go on without each other until their merge
    float m = -INFINITY, l = 0.0f, o[DIM_TILES][4] = {};
    if (warp_in) {
        // s = q K^T on tensor cores with q in all 16 rows of A: lane (g, i) gets the scores of keys 8 n + 2 i,
        // 8 n + 2 i + 1 of each tile n (c[0], c[1]; c[2], c[3] the same again)
        const int i = lane % 4;
        float s[KEY_TILES][4] = {};
        // A of the k-step of dimensions 16 d .. 16 d + 15: q in all 16 rows
        auto q_frag = [&](uint32_t (&a)[4], int d) {
            a[0] = a[1] = *(const uint32_t*)&q[w][16 * d + 2 * i];
            a[2] = a[3] = *(const uint32_t*)&q[w][16 * d + 2 * i + 8];
        };
        if constexpr (HD >= 32) {
            #pragma unroll
            for (int d2 = 0; d2 < HD / 32; d2++) { // two k-steps: chunks 4 d2 .. 4 d2 + 3 of a key tile, one ldmatrix
                uint32_t a0[4], a1[4];
                q_frag(a0, 2 * d2);
                q_frag(a1, 2 * d2 + 1);
                #pragma unroll
                for (int nt = 0; nt < KEY_TILES; nt++) {
                    uint32_t kf[4];
                    ldmatrix_x4(kf, ks + decode_chunk<HD>(w0 + 8 * nt + lane % 8, 4 * d2 + lane / 8) * 8);
                    mma_16816(s[nt], a0, kf[0], kf[1]);
                    mma_16816(s[nt], a1, kf[2], kf[3]);
                }
            }
        } else { // head size 16: one k-step, the two chunks of two key tiles a ldmatrix
            uint32_t a0[4];
            q_frag(a0, 0);
            #pragma unroll
            for (int nt = 0; nt < KEY_TILES; nt += 2) {
                uint32_t kf[4];
                ldmatrix_x4(kf, ks + decode_chunk<HD>(w0 + 8 * (nt + lane / 16) + lane % 8, (lane / 8) % 2) * 8);
                mma_16816(s[nt], a0, kf[0], kf[1]);
                mma_16816(s[nt + 1], a0, kf[2], kf[3]);
            }
        }
        #pragma unroll
        for (int nt = 0; nt < KEY_TILES; nt++) {
            #pragma unroll
            for (int x = 0; x < 2; x++) {
                const int t = w0 + 8 * nt + 2 * i + x;
                s[nt][x] = t <= t_new ? s[nt][x] * scale : -INFINITY;
                m = fmaxf(m, s[nt][x]);
            }
        }
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2)); // finite: the warp's first row is in
        // p = exp(s - m) rounded to bf16 (the A operand of p V); l sums the rounded p
        uint32_t pf[KEY_TILES];
        #pragma unroll
        for (int nt = 0; nt < KEY_TILES; nt++) {
            pf[nt] = pack_bf16(expf(s[nt][0] - m), expf(s[nt][1] - m));
            l += __bfloat162float(__ushort_as_bfloat16((unsigned short)(pf[nt] & 0xffffu))) +
                 __bfloat162float(__ushort_as_bfloat16((unsigned short)(pf[nt] >> 16)));
        }
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        // o = p V: 16 keys a k-step (A: p of key tiles 2 kk, 2 kk + 1), V's 8x8 blocks transposed by ldmatrix
        #pragma unroll
        for (int kk = 0; kk < KEY_TILES / 2; kk++) {
            const uint32_t a[4] = {pf[2 * kk], pf[2 * kk], pf[2 * kk + 1], pf[2 * kk + 1]};
            #pragma unroll
            for (int dt = 0; dt < DIM_TILES; dt += 2) {
                uint32_t vf[4]; // keys + 0..7 and + 8..15 of dimension tiles dt, dt + 1
                ldmatrix_x4_trans(vf, vs + decode_chunk<HD>(w0 + 16 * kk + (lane / 8) % 2 * 8 + lane % 8, dt + lane / 16) * 8);
                mma_16816(o[dt], a, vf[0], vf[1]);
                mma_16816(o[dt + 1], a, vf[2], vf[3]);
            }
        }
    }
    // the warps merged in order: m = max m_w, o = sum exp(m_w - m) o_w, l likewise (a warp past the end: m_w =
    // -inf, weight 0); lane (0, i) holds dimensions 8 dt + 2 i, 8 dt + 2 i + 1
    if (lane < 4) {
        #pragma unroll
        for (int dt = 0; dt < DIM_TILES; dt++) {
            warp_o[w][8 * dt + 2 * lane] = o[dt][0];
            warp_o[w][8 * dt + 2 * lane + 1] = o[dt][1];
        }
        if (lane == 0) {
            warp_m[w] = m;
            warp_l[w] = l;
        }
    }
    __syncthreads();
    const size_t split = ((size_t)b * NH + h) * splits + j;
    const int used = (n - 1) / DECODE_SPLIT + 1;
    if (tid < HD) { // a thread per output dimension
        float m_all = warp_m[0];
        #pragma unroll
        for (int v = 1; v < DECODE_WARPS; v++) { m_all = fmaxf(m_all, warp_m[v]); } // finite: row 0 is in (t0 < n)
        float o_d = 0.0f, l_all = 0.0f;
        #pragma unroll
        for (int v = 0; v < DECODE_WARPS; v++) {
            const float scale_w = expf(warp_m[v] - m_all); // 0 for a warp past the end
            o_d += scale_w * warp_o[v][tid];
            l_all += scale_w * warp_l[v];
        }
        if (used == 1) { out[(size_t)b * NH * HD + h * HD + tid] = __float2bfloat16_rn(o_d / l_all); } // the combine's bits
        else { part_o[split * HD + tid] = o_d; }
        if (tid == 0 && used > 1) { part_ml[2 * split] = m_all; part_ml[2 * split + 1] = l_all; }
    }
    if (used == 1) { return; } // the only split: nothing to combine
    if (block_arrives_last(splits_done + (size_t)b * NH + h, used)) { // the last split combines
        decode_attention_combine(out, part_o, part_ml, b, h, NH, HD, splits, used);
    }
}

template <int HD>
static void decode_attention_launch(dim3 grid, bf16* out, float* part_o, float* part_ml, int* splits_done,
                                    const bf16* qkv, bf16* k_cache, bf16* v_cache, const int* slot, const int* pos,
                                    int NH, int NKV, int cache_len, int splits, float theta) {
    const size_t smem = 2 * DECODE_SPLIT * HD * sizeof(bf16); // 64 KB at HD 128: past the default 48
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(decode_attention_split_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
        prefer_shared_memory(decode_attention_split_kernel<HD>);
        configured = true;
    }
    launch_early(decode_attention_split_kernel<HD>, grid, DECODE_THREADS, smem, out, part_o, part_ml, splits_done,
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
