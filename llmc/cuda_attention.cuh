/*
 Causal grouped-query attention on the GPU, flash-attention style: bf16 in and
 out, fp32 accumulation, nothing of size T x T ever in memory.

 Math, per sequence b, query head h (key/value head kvh = h / (NH/NKV)), query
 row t, keys j <= t, scale c = 1/sqrt(hd):
     s_tj = c q_t.k_j            p_tj = exp(s_tj - lse_t),  lse_t = log sum_j exp(s_tj)
     out_t = sum_j p_tj v_j
 backward, with dp_tj = dout_t.v_j and delta_t = dout_t.out_t (= sum_j p_tj dp_tj):
     ds_tj = p_tj (dp_tj - delta_t)
     dq_t = c sum_j ds_tj k_j     dk_j = c sum_{h in group, t >= j} ds_tj q_t     dv_j = sum_{h, t} p_tj dout_t
 The kernels work with scores in base 2: p = exp2(q.k c log2(e) - m), in the
 tensor-core paths one FMA and one ex2.approx.ftz per score (exp2f is
 ex2.approx.f32, whose subnormal handling costs extra instructions around the
 multi-function unit's), with the running max m kept in raw score units.
 Masks are written as scores of -inf (2^-inf = 0), and only on the blocks
 that cross the diagonal or the end: a data-dependent "masked ? 0 : exp2f(..)"
 became a branch around each exp2 and its shared memory loads, and cost the
 backward kernels half their time.

 The backward is deterministic (no atomics, every sum in a fixed order), so
 dK, dV and dQ come from two separate passes over the score matrix: one with
 keys outside and queries inside, one the other way round. Both recompute S
 and dP: 7 matrix products instead of the 5 of an atomic dQ, the price of
 bit-identical results.

 Three paths, picked per call, each in a file of its own:
 1. wgmma (Hopper, sm_90a; hd 64 and 128, 16-byte aligned pointers):
    llmc/cuda_attention_wgmma.cuh;
 2. mma.sync (sm_80 on; other GPUs, and the same shapes):
    llmc/cuda_attention_mma.cuh;
 3. generic (any hd up to 128, other alignments): one warp per row, the same
    math in fp32 with the same fixed orders: llmc/cuda_attention_generic.cuh.

 Scratch of the backward: B*T*NH floats (delta).
*/
#ifndef LLMC_CUDA_ATTENTION_CUH
#define LLMC_CUDA_ATTENTION_CUH

#include "llmc/cuda_attention_generic.cuh"
#include "llmc/cuda_attention_mma.cuh"
#include "llmc/cuda_attention_wgmma.cuh"

namespace attention_detail {

static inline void check_attention_shape(int NH, int NKV, int hd) {
    if (NKV < 1 || NH % NKV != 0) { fatal("attention: %d query heads are not a multiple of %d kv heads", NH, NKV); }
    if (hd < 1 || hd > 32 * kGenericSlots) { fatal("attention: head size %d, the CUDA kernels take 1 to 128", hd); }
}

static inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

enum Path { kGenericPath, kMmaPath, kWgmmaPath };

// the tensor-core kernels read 16-byte pieces of head vectors
template <typename... Ptrs>
static inline Path attention_path(int hd, const Ptrs*... ptrs) {
    if ((hd != 64 && hd != 128) || !(aligned16(ptrs) && ...)) { return kGenericPath; }
    return device_has_wgmma() ? kWgmmaPath : kMmaPath;
}

template <int HD>
static void attention_forward_fast(Path path, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV) {
    using Tiles = WgmmaTiles<HD>;
    if (path == kWgmmaPath) {
        attention_forward_wgmma<HD, Tiles::kFwdBlockK, Tiles::kFwdWarpgroups, Tiles::kFwdStages>(out, lse, qkv, B, T,
                                                                                              NH, NKV);
    } else {
        attention_forward_mma<HD, kFwdWarps>(out, lse, qkv, B, T, NH, NKV);
    }
}

template <int HD>
static void attention_backward_fast(Path path, bf16* dqkv, float* delta, const bf16* dout, const bf16* out,
                                    const bf16* qkv, const float* lse, int B, int T, int NH, int NKV) {
    using Tiles = WgmmaTiles<HD>;
    if (path == kWgmmaPath) { // dQ first: it writes delta
        attention_backward_dq_wgmma<HD, Tiles::kDqBlockK, Tiles::kDqWarpgroups, Tiles::kDqStages>(
            dqkv, delta, dout, out, qkv, lse, B, T, NH, NKV);
        attention_backward_dkdv_wgmma<HD, Tiles::kDkvBlockQ, Tiles::kDkvWarpgroups, Tiles::kDkvStages>(
            dqkv, dout, qkv, lse, delta, B, T, NH, NKV);
    } else {
        attention_delta(delta, dout, out, B, T, NH, HD);
        attention_backward_dkdv_mma<HD, kDkvWarps>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV);
        attention_backward_dq_mma<HD, kDqWarps>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV);
    }
}

// the two entry points on a given path (the test runs each path)
static void attention_forward_on(Path path, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV,
                                 int hd) {
    check_attention_shape(NH, NKV, hd);
    if (B == 0 || T == 0) { return; }
    if (path == kGenericPath) {
        attention_forward_generic(out, lse, qkv, B, T, NH, NKV, hd);
    } else if (hd == 64) {
        attention_forward_fast<64>(path, out, lse, qkv, B, T, NH, NKV);
    } else {
        attention_forward_fast<128>(path, out, lse, qkv, B, T, NH, NKV);
    }
}

static void attention_backward_on(Path path, bf16* dqkv, float* scratch, const bf16* dout, const bf16* out,
                                  const bf16* qkv, const float* lse, int B, int T, int NH, int NKV, int hd) {
    check_attention_shape(NH, NKV, hd);
    if (B == 0 || T == 0) { return; }
    float* delta = scratch;
    if (path == kGenericPath) {
        attention_backward_generic(dqkv, delta, dout, out, qkv, lse, B, T, NH, NKV, hd);
    } else if (hd == 64) {
        attention_backward_fast<64>(path, dqkv, delta, dout, out, qkv, lse, B, T, NH, NKV);
    } else {
        attention_backward_fast<128>(path, dqkv, delta, dout, out, qkv, lse, B, T, NH, NKV);
    }
}


} // namespace attention_detail

// ----------------------------------------------------------------------------
// the overloads gpt.h calls (see the CPU templates in llmc/cpu_ops.h)

// qkv [B, T, (NH + 2 NKV) hd] after RoPE -> out [B, T, NH hd], lse [B, NH, T]
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int NKV, int hd) {
    using namespace attention_detail;
    attention_forward_on(attention_path(hd, out, qkv), out, lse, qkv, B, T, NH, NKV, hd);
}

// dqkv (overwritten) from dout; scratch holds B*T*NH floats
void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* out, const bf16* qkv,
                        const float* lse, int B, int T, int NH, int NKV, int hd) {
    using namespace attention_detail;
    attention_backward_on(attention_path(hd, dqkv, dout, out, qkv), dqkv, scratch, dout, out, qkv, lse, B, T, NH,
                          NKV, hd);
}

#endif // LLMC_CUDA_ATTENTION_CUH
