/*
 Attention over a key/value cache on the GPU, for inference: the prefill of a
 batch of prompts and the decode step of a batch of sequences, with RoPE and
 the cache writes. The math is attention's (llmc/cuda_attention.cuh) and
 RoPE's (llmc/cuda_rope.cuh); the CPU reference is attention_forward_cached of
 llmc/cpu_ops.h. One layer's cache is [slots, cache_len, NKV hd], keys after
 RoPE; row m of a call is position pos[m] of the sequence in cache slot
 slot[m] (a decode step: row b is sequence b).

 Prefill: RoPE at each row's own position (the rope_kernel's angle and
 rounding), then the row's k and v into the cache of its sequence. One thread
 per (row, 8 consecutive pairs), as rope_kernel: the angles once, then those
 pairs of every q and k head, in 16-byte accesses (a thread per head computed
 each angle 64 times over; a thread per pair made 2-byte accesses). A prompt starts
 at position 0, so each prompt then attends causally over its own rows with
 the training kernels; consecutive prompts of one length go as one batch (one
 launch instead of one per prompt).

 Decode, split over the cache (flash-decoding), RoPE included: the new row's q
 and k (in qkv, not yet turned) are turned at position pos[b] here
 (rope_angle/rope_turn, the bits of the prefill's RoPE), the new key and value
 are taken from qkv, and the first q head of each kv head's group stores them
 in the cache for later steps (one kernel less per layer). Block (head h,
 sequence b, split j) takes positions 128 j .. 128 j + 127 (those <= pos[b]):
 a thread scores one key, then groups of threads sum p v over the split's
 positions (the keys and values come into shared memory by cp.async before
 the wait: at 40 registers a thread, not 168 with them in registers, the
 blocks fit beside a block of the qkv GEMV, so they are resident with their
 cache loaded before it ends); the split leaves its max m_j, sum
 l_j = sum exp(s - m_j) and o_j = sum exp(s - m_j) v. The last of a head's
 splits to finish (a counter per head and sequence) combines them, in split
 order:
     m = max_j m_j,  out = sum_j exp(m_j - m) o_j / sum_j exp(m_j - m) l_j
 (a cache of one split writes out = o_0 / l_0 at once: the same bits). So a
 long cache spreads over many SMs. Head sizes 16, 32, 64 and 128.
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

} // namespace attention_detail

// ----------------------------------------------------------------------------
// the overloads gpt.h calls (see the CPU templates in llmc/cpu_ops.h)

// the head sizes the decode attention is built for
static inline bool attention_decode_supports(int hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128; }

// splits of a cache of cache_len positions per (sequence, head) in a decode step
static inline int attention_decode_splits(int cache_len) { return ceil_div(cache_len, attention_detail::DECODE_SPLIT); }

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
// prompt s is rows seq_rows[s] .. seq_rows[s] + seq_lens[s] - 1 (host arrays),
// positions 0 .. seq_lens[s] - 1; lse [M, NH] is scratch
void attention_prefill(bf16* out, float* lse, bf16* qkv, bf16* k_cache, bf16* v_cache, const int* slot, const int* pos,
                       int M, const int* seq_rows, const int* seq_lens, int nseq, int NH, int NKV, int hd, int cache_len,
                       float theta) {
    const int vec = rope_pairs_per_thread(hd);
    auto rope_cache = vec == 8 ? attention_detail::rope_cache_kernel<8> : attention_detail::rope_cache_kernel<1>;
    rope_cache<<<ceil_div(M * (hd / 2 / vec), 256), 256, 0, main_stream>>>(qkv, k_cache, v_cache, slot, pos, M, NH, NKV,
                                                                            hd, cache_len, theta);
    cudaCheck(cudaGetLastError());
    const int D = NH * hd, QKV = (NH + 2 * NKV) * hd;
    for (int s = 0, e; s < nseq; s = e) {
        for (e = s + 1; e < nseq && seq_lens[e] == seq_lens[s]; e++) {}
        attention_forward(out + (size_t)seq_rows[s] * D, lse, qkv + (size_t)seq_rows[s] * QKV, e - s, seq_lens[s], NH,
                          NKV, hd);
    }
}

// Decode: out [B, NH hd] from the new rows qkv [B, QKV] (q and k not yet
// turned) and the cache, where the new k and v go (position pos[b] of
// sequence b); part_o, part_ml, splits_done: attention_decode_alloc's
void attention_decode(bf16* out, float* part_o, float* part_ml, int* splits_done, const bf16* qkv, bf16* k_cache,
                      bf16* v_cache, const int* pos, int B, int NH, int NKV, int hd, int cache_len, float theta) {
    using namespace attention_detail;
    const int splits = attention_decode_splits(cache_len);
    const dim3 grid(NH, B, splits);
    switch (hd) {
    case 16: decode_attention_launch<16>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, pos, NH, NKV, cache_len, splits, theta); break;
    case 32: decode_attention_launch<32>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, pos, NH, NKV, cache_len, splits, theta); break;
    case 64: decode_attention_launch<64>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, pos, NH, NKV, cache_len, splits, theta); break;
    case 128: decode_attention_launch<128>(grid, out, part_o, part_ml, splits_done, qkv, k_cache, v_cache, pos, NH, NKV, cache_len, splits, theta); break;
    default: fatal("decode attention: head size %d, built for 16, 32, 64, 128", hd);
    }
}

#endif // LLMC_CUDA_ATTENTION_CACHED_CUH
