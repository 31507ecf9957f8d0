/*
 The CPU reference kernels: every layer of the model, forward and backward, in
 plain C++ with OpenMP. They are templates over the element type T: float for
 the CPU training path, double for the finite-difference gradient checks. The
 CUDA kernels (llmc/cuda_*.cuh) have the same signatures with T = bf16 for
 activations and G = float for gradients, norms statistics and losses; here
 G = T. llmc/gpt.h calls them without knowing which backend it drives.

 Shapes: M = tokens (B*T), D = model width, H = FFN width, NH/NKV = query and
 key/value heads, hd = D/NH head size, QKV = D + 2*NKV*hd (the fused q,k,v row).
 Every reduction runs in a fixed order, so results do not depend on the number
 of threads and a resumed run repeats the original bit for bit.
*/
#ifndef LLMC_CPU_OPS_H
#define LLMC_CPU_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "llmc/model.h"
#include "llmc/rng.h"
#include "llmc/utils.h"

// ----------------------------------------------------------------------------
// matrix products. C[M,N] = A[M,K] B[N,K]^T (nt), A[M,K] B[K,N] (nn), or
// A[K,M]^T B[K,N] (tn); accumulate adds to C instead of overwriting it.
// Row strides are the inner dimension of each operand.

// 4x4 register tile of the nt product: 16 dot products over K
template <typename T>
static inline void gemm_nt_tile4(T* C, const T* A, const T* B, int N, int K, int accumulate) {
    T c00 = 0, c01 = 0, c02 = 0, c03 = 0, c10 = 0, c11 = 0, c12 = 0, c13 = 0;
    T c20 = 0, c21 = 0, c22 = 0, c23 = 0, c30 = 0, c31 = 0, c32 = 0, c33 = 0;
    const T *a0 = A, *a1 = A + K, *a2 = A + 2 * K, *a3 = A + 3 * K;
    const T *b0 = B, *b1 = B + K, *b2 = B + 2 * K, *b3 = B + 3 * K;
    #pragma omp simd reduction(+:c00,c01,c02,c03,c10,c11,c12,c13,c20,c21,c22,c23,c30,c31,c32,c33)
    for (int k = 0; k < K; k++) {
        c00 += a0[k] * b0[k]; c01 += a0[k] * b1[k]; c02 += a0[k] * b2[k]; c03 += a0[k] * b3[k];
        c10 += a1[k] * b0[k]; c11 += a1[k] * b1[k]; c12 += a1[k] * b2[k]; c13 += a1[k] * b3[k];
        c20 += a2[k] * b0[k]; c21 += a2[k] * b1[k]; c22 += a2[k] * b2[k]; c23 += a2[k] * b3[k];
        c30 += a3[k] * b0[k]; c31 += a3[k] * b1[k]; c32 += a3[k] * b2[k]; c33 += a3[k] * b3[k];
    }
    T c[4][4] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}};
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++) {
            C[(size_t)i * N + j] = accumulate ? C[(size_t)i * N + j] + c[i][j] : c[i][j];
        }
    }
}

template <typename T>
static inline T dot(const T* a, const T* b, int K) {
    T sum = 0;
    #pragma omp simd reduction(+:sum)
    for (int k = 0; k < K; k++) { sum += a[k] * b[k]; }
    return sum;
}

template <typename T>
void gemm_nt(T* C, const T* A, const T* B, int M, int N, int K, int accumulate) {
    const int MC = 64, NC = 64; // blocks of A and B that stay in L2 together
    int m_blocks = (M + MC - 1) / MC, n_blocks = (N + NC - 1) / NC;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int mb = 0; mb < m_blocks; mb++) {
        for (int nb = 0; nb < n_blocks; nb++) {
            int m_end = mb * MC + MC < M ? mb * MC + MC : M;
            int n_end = nb * NC + NC < N ? nb * NC + NC : N;
            for (int n = nb * NC; n < n_end; n += 4) {
                for (int m = mb * MC; m < m_end; m += 4) {
                    if (m + 4 <= m_end && n + 4 <= n_end) {
                        gemm_nt_tile4(C + (size_t)m * N + n, A + (size_t)m * K, B + (size_t)n * K, N, K, accumulate);
                        continue;
                    }
                    for (int i = m; i < m + 4 && i < m_end; i++) {
                        for (int j = n; j < n + 4 && j < n_end; j++) {
                            T c = dot(A + (size_t)i * K, B + (size_t)j * K, K);
                            C[(size_t)i * N + j] = accumulate ? C[(size_t)i * N + j] + c : c;
                        }
                    }
                }
            }
        }
    }
}

// C rows [m, m+rows) += A-scaled rows of B: the shared inner loop of nn and tn.
// a(i, k) gives the coefficient of row k of B for row i of C.
#define GEMM_AXPY_BLOCK(a)                                                        \
    for (int n0 = 0; n0 < N; n0 += NC) {                                          \
        int n1 = n0 + NC < N ? n0 + NC : N;                                       \
        for (int k = 0; k < K; k++) {                                             \
            const T* b = B + (size_t)k * N;                                       \
            for (int i = 0; i < rows; i++) {                                      \
                T coef = a(i, k);                                                 \
                T* c = C + (size_t)(m + i) * N;                                   \
                _Pragma("omp simd")                                               \
                for (int n = n0; n < n1; n++) { c[n] += coef * b[n]; }            \
            }                                                                     \
        }                                                                         \
    }

template <typename T>
void gemm_nn(T* C, const T* A, const T* B, int M, int N, int K, int accumulate) {
    const int MR = 4, NC = 512; // 4 rows of C, 512 columns at a time stay in L1
    if (!accumulate) { memset(C, 0, (size_t)M * N * sizeof(T)); }
    #pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m += MR) {
        int rows = m + MR <= M ? MR : M - m;
        #define A_NN(i, k) A[(size_t)(m + (i)) * K + (k)]
        GEMM_AXPY_BLOCK(A_NN)
        #undef A_NN
    }
}

template <typename T>
void gemm_tn(T* C, const T* A, const T* B, int M, int N, int K, int accumulate) {
    const int MR = 4, NC = 512;
    if (!accumulate) { memset(C, 0, (size_t)M * N * sizeof(T)); }
    #pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m += MR) {
        int rows = m + MR <= M ? MR : M - m;
        #define A_TN(i, k) A[(size_t)(k) * M + m + (i)]
        GEMM_AXPY_BLOCK(A_TN)
        #undef A_TN
    }
}
#undef GEMM_AXPY_BLOCK

// C[M,N] (+)= op(A) op(B), row-major: op(A) is [M,K] (A stored [K,M] if
// trans_a), op(B) is [K,N] (B stored [N,K] if trans_b). The three forms the
// model needs; the GPU version (cuBLASLt) takes any.
template <typename T>
void gemm(T* C, const T* A, const T* B, int M, int N, int K, int trans_a, int trans_b, int accumulate) {
    if (!trans_a && trans_b) { gemm_nt(C, A, B, M, N, K, accumulate); }
    else if (!trans_a && !trans_b) { gemm_nn(C, A, B, M, N, K, accumulate); }
    else if (trans_a && !trans_b) { gemm_tn(C, A, B, M, N, K, accumulate); }
    else { fatal("gemm: both operands transposed is not a form the model uses"); }
}

// a linear layer of a decode step, y[B,N] = x W^T (W [N,K]): the plain product
// here; the GPU has a GEMV for few rows
template <typename T>
void decode_linear(T* y, const T* x, const T* w, int B, int N, int K) {
    gemm(y, x, w, B, N, K, 0, 1, 0);
}

// C1 = A B1^T and C2 = A B2^T: two nt products of one A (the GPU runs them as one batched product)
template <typename T>
void gemm_pair(T* C1, T* C2, const T* A, const T* B1, const T* B2, int M, int N, int K) {
    gemm(C1, A, B1, M, N, K, 0, 1, 0);
    gemm(C2, A, B2, M, N, K, 0, 1, 0);
}

// ----------------------------------------------------------------------------
// embedding: out[m] = wte[tokens[m]]

template <typename T>
void encoder_forward(T* out, const int* tokens, const T* wte, int M, int D) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        memcpy(out + (size_t)m * D, wte + (size_t)tokens[m] * D, D * sizeof(T));
    }
}

// out[r] = in[rows[r]] for r < n: the embedding's gather, for any table of rows
template <typename T>
void gather_rows(T* out, const T* in, const int* rows, int n, int D) {
    encoder_forward(out, rows, in, n, D);
}

// dwte[tokens[m]] += dout[m]; serial over m because tokens repeat
template <typename T>
void encoder_backward(T* dwte, const T* dout, const int* tokens, int M, int D) {
    for (int m = 0; m < M; m++) {
        T* row = dwte + (size_t)tokens[m] * D;
        const T* d = dout + (size_t)m * D;
        #pragma omp simd
        for (int i = 0; i < D; i++) { row[i] += d[i]; }
    }
}

// ----------------------------------------------------------------------------
// RMSNorm: rstd = 1/sqrt(mean(x^2) + eps), out = x * rstd * w
// (early: how the GPU launches its kernel; nothing here)

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int M, int D, float eps, bool early = false) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const T* x = inp + (size_t)m * D;
        T r = 1 / sqrt(dot(x, x, D) / D + (T)eps);
        T* o = out + (size_t)m * D;
        for (int i = 0; i < D; i++) { o[i] = x[i] * r * w[i]; }
        if (rstd) { rstd[m] = r; }
    }
}

// out = inp * rstd * w with the rstd of an earlier rmsnorm_forward of inp: that forward's out again, to the
// bit (the backward recomputes the norms' outputs instead of keeping one per layer)
template <typename T>
void rmsnorm_apply(T* out, const T* inp, const T* rstd, const T* w, int M, int D) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const T* x = inp + (size_t)m * D;
        T* o = out + (size_t)m * D;
        for (int i = 0; i < D; i++) { o[i] = x[i] * rstd[m] * w[i]; }
    }
}

// the residual add fused with the norm that follows it:
// x_out = x + y, norm_out = RMSNorm(x_out; w)
template <typename T>
void fused_residual_rmsnorm_forward(T* x_out, T* norm_out, T* rstd, const T* x, const T* y, const T* w,
                                    int M, int D, float eps, bool early = false) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        size_t row = (size_t)m * D;
        for (int i = 0; i < D; i++) { x_out[row + i] = x[row + i] + y[row + i]; }
    }
    rmsnorm_forward(norm_out, rstd, x_out, w, M, D, eps);
}

// dinp += rstd * (dout*w - n * mean(dout*w*n)) with n = x*rstd;  dw += sum_m dout*n
// (scratch is for the GPU's two-stage weight-gradient sum; unused here)
template <typename T>
void rmsnorm_backward(T* dinp, T* dw, T* scratch, const T* dout, const T* inp, const T* w, const T* rstd, int M, int D) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const T* x = inp + (size_t)m * D;
        const T* dy = dout + (size_t)m * D;
        T r = rstd[m];
        T proj = 0;
        for (int i = 0; i < D; i++) { proj += dy[i] * w[i] * x[i] * r; }
        proj /= D;
        T* dx = dinp + (size_t)m * D;
        for (int i = 0; i < D; i++) { dx[i] += r * (dy[i] * w[i] - x[i] * r * proj); }
    }
    // the weight gradient sums over tokens: parallel over features keeps it race free
    #pragma omp parallel for
    for (int i = 0; i < D; i++) {
        T sum = 0;
        for (int m = 0; m < M; m++) { sum += dout[(size_t)m * D + i] * inp[(size_t)m * D + i] * rstd[m]; }
        dw[i] += sum;
    }
}

// ----------------------------------------------------------------------------
// RoPE, HF "rotate half": within each head, pairs (i, i + hd/2) turn by the
// angle pos * theta^(-2i/hd). In place on the q and k heads at the start of
// each fused qkv row (stride (NH + 2 NKV) hd); row t of sequence b is at
// position pos0 + t. The backward turns the gradient back by the same angle.

template <typename T>
void rope_rotate(T* qkv, int B, int T_, int pos0, int NH, int NKV, int hd, float theta, int inverse) {
    int half = hd / 2, heads = NH + NKV, stride = (NH + 2 * NKV) * hd;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T_; t++) {
            T* row = qkv + ((size_t)b * T_ + t) * stride;
            for (int i = 0; i < half; i++) {
                double angle = (double)(pos0 + t) * pow((double)theta, -2.0 * i / hd);
                T c = (T)cos(angle), s = (T)(inverse ? -sin(angle) : sin(angle));
                for (int h = 0; h < heads; h++) {
                    T* x = row + h * hd;
                    T x1 = x[i], x2 = x[i + half];
                    x[i] = x1 * c - x2 * s;
                    x[i + half] = x2 * c + x1 * s;
                }
            }
        }
    }
}

template <typename T>
void rope_forward(T* qkv, int B, int T_, int pos0, int NH, int NKV, int hd, float theta) {
    rope_rotate(qkv, B, T_, pos0, NH, NKV, hd, theta, 0);
}

template <typename T>
void rope_backward(T* dqkv, int B, int T_, int NH, int NKV, int hd, float theta) {
    rope_rotate(dqkv, B, T_, 0, NH, NKV, hd, theta, 1);
}

// ----------------------------------------------------------------------------
// causal grouped-query attention. Query row t of a sequence (absolute
// position pos0 + t) attends to keys 0..pos0+t; query head h reads key/value
// head h / (NH/NKV); scores are q.k / sqrt(hd). Nothing of size T x T is kept:
// the forward saves lse = log sum_j exp(score_j) per query and head, from which
// the backward recomputes the probabilities.

// one query row: out = softmax(scores) v, returns the log-sum-exp
template <typename T>
T attention_row(T* out, T* scores, const T* q, const T* k, const T* v, int n_keys, int kv_stride, int hd) {
    T scale = 1 / sqrt((T)hd), maxval = -INFINITY;
    for (int j = 0; j < n_keys; j++) {
        scores[j] = dot(q, k + (size_t)j * kv_stride, hd) * scale;
        if (scores[j] > maxval) { maxval = scores[j]; }
    }
    T sum = 0;
    for (int j = 0; j < n_keys; j++) { scores[j] = exp(scores[j] - maxval); sum += scores[j]; }
    for (int i = 0; i < hd; i++) { out[i] = 0; }
    for (int j = 0; j < n_keys; j++) {
        T p = scores[j] / sum;
        const T* vj = v + (size_t)j * kv_stride;
        for (int i = 0; i < hd; i++) { out[i] += p * vj[i]; }
    }
    return maxval + log(sum);
}

// training: qkv [B, T, (NH + 2 NKV) hd] -> out [B, T, NH hd], lse [B, NH, T]
template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int NH, int NKV, int hd) {
    int D = NH * hd, KVD = NKV * hd, QKV = D + 2 * KVD, group = NH / NKV;
    #pragma omp parallel
    {
        T* scores = (T*)mallocCheck((size_t)T_ * sizeof(T));
        #pragma omp for collapse(3)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int t = 0; t < T_; t++) {
                    const T* base = qkv + (size_t)b * T_ * QKV;
                    lse[((size_t)b * NH + h) * T_ + t] = attention_row(
                        out + ((size_t)b * T_ + t) * D + h * hd, scores, base + (size_t)t * QKV + h * hd,
                        base + D + (h / group) * hd, base + D + KVD + (h / group) * hd, t + 1, QKV, hd);
                }
            }
        }
        free(scores);
    }
}

// inference over a key/value cache [slots, cache_len, NKV hd] (one layer's):
// M new rows of qkv, row m at position pos[m] of the sequence in cache slot
// slot[m] (slot NULL: slot m). RoPE turns the row's q and k (qkv itself is left
// as it is), its k and v go into the cache, then
//     out_m = softmax_j(q_m . k_j / sqrt(hd)) v_j over the positions j <= pos[m] of its sequence
// (a row sees the rows of the same call that come before it in its sequence)
template <typename T>
void attention_forward_cached(T* out, const T* qkv, T* k_cache, T* v_cache, const int* slot, const int* pos, int M,
                              int NH, int NKV, int hd, int cache_len, float theta) {
    int D = NH * hd, KVD = NKV * hd, QKV = D + 2 * KVD, group = NH / NKV;
    T* q = (T*)mallocCheck((size_t)M * QKV * sizeof(T)); // the rows, turned
    memcpy(q, qkv, (size_t)M * QKV * sizeof(T));
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        T* row = q + (size_t)m * QKV;
        rope_forward(row, 1, 1, pos[m], NH, NKV, hd, theta);
        size_t at = ((size_t)(slot ? slot[m] : m) * cache_len + pos[m]) * KVD;
        memcpy(k_cache + at, row + D, KVD * sizeof(T));
        memcpy(v_cache + at, row + D + KVD, KVD * sizeof(T));
    }
    #pragma omp parallel
    {
        T* scores = (T*)mallocCheck((size_t)cache_len * sizeof(T));
        #pragma omp for collapse(2)
        for (int m = 0; m < M; m++) {
            for (int h = 0; h < NH; h++) {
                size_t seq = (size_t)(slot ? slot[m] : m) * cache_len * KVD + (h / group) * hd;
                attention_row(out + (size_t)m * D + h * hd, scores, q + (size_t)m * QKV + h * hd, k_cache + seq,
                              v_cache + seq, pos[m] + 1, KVD, hd);
            }
        }
        free(scores);
    }
    free(q);
}

// the cached attention of a prefill and of a decode step, with the GPU's
// signatures (llmc/cuda_attention_cached.cuh): the prompts' row ranges and
// first positions, lse, the decode scratch and its context bound are what its
// kernels need; here both are the above
template <typename T>
void attention_prefill(T* out, float* lse, T* qkv, T* k_cache, T* v_cache, const int* slot, const int* pos, int M,
                       const int* seq_rows, const int* seq_lens, const int* seq_starts, int nseq, int NH, int NKV,
                       int hd, int cache_len, float theta) {
    attention_forward_cached(out, qkv, k_cache, v_cache, slot, pos, M, NH, NKV, hd, cache_len, theta);
}

template <typename T>
void attention_decode(T* out, float* part_o, float* part_ml, int* splits_done, const T* qkv, T* k_cache, T* v_cache,
                      const int* slot, const int* pos, int B, int NH, int NKV, int hd, int cache_len, int context,
                      float theta) {
    attention_forward_cached(out, qkv, k_cache, v_cache, slot, pos, B, NH, NKV, hd, cache_len, theta);
}

// Backward: dqkv (overwritten) from dout. Each thread owns one (sequence, kv
// head) and sums dk, dv over the query heads of its group in a fixed order.
// scratch holds B * NKV * T values.
template <typename T>
void attention_backward(T* dqkv, T* scratch, const T* dout, const T* out, const T* qkv, const T* lse,
                        int B, int T_, int NH, int NKV, int hd) {
    int D = NH * hd, KVD = NKV * hd, QKV = D + 2 * KVD, group = NH / NKV;
    T scale = 1 / sqrt((T)hd);
    memset(dqkv, 0, (size_t)B * T_ * QKV * sizeof(T));
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            T* dp = scratch + ((size_t)b * NKV + kvh) * T_;
            const T* base = qkv + (size_t)b * T_ * QKV;
            T* dbase = dqkv + (size_t)b * T_ * QKV;
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int t = 0; t < T_; t++) {
                    const T* do_t = dout + ((size_t)b * T_ + t) * D + h * hd;
                    const T* o_t = out + ((size_t)b * T_ + t) * D + h * hd;
                    const T* q_t = base + (size_t)t * QKV + h * hd;
                    T* dq_t = dbase + (size_t)t * QKV + h * hd;
                    T row_lse = lse[((size_t)b * NH + h) * T_ + t];
                    // sum_j p_j dp_j = do . o, so the softmax backward needs no second pass
                    T delta = dot(do_t, o_t, hd);
                    for (int j = 0; j <= t; j++) {
                        const T* k_j = base + (size_t)j * QKV + D + kvh * hd;
                        const T* v_j = base + (size_t)j * QKV + D + KVD + kvh * hd;
                        T* dk_j = dbase + (size_t)j * QKV + D + kvh * hd;
                        T* dv_j = dbase + (size_t)j * QKV + D + KVD + kvh * hd;
                        T p = exp(dot(q_t, k_j, hd) * scale - row_lse);
                        dp[j] = dot(do_t, v_j, hd);
                        T ds = p * (dp[j] - delta) * scale;
                        for (int i = 0; i < hd; i++) {
                            dv_j[i] += p * do_t[i];
                            dq_t[i] += ds * k_j[i];
                            dk_j[i] += ds * q_t[i];
                        }
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// rows in a new order

// out[r] = in[perm[r]] for `rows` rows of D (out and in distinct): a new order of a layer's units
template <typename T>
void permute_rows(T* out, const T* in, const int* perm, int rows, int D) {
    #pragma omp parallel for
    for (int r = 0; r < rows; r++) { memcpy(out + (size_t)r * D, in + (size_t)perm[r] * D, D * sizeof(T)); }
}

// ----------------------------------------------------------------------------
// the classifier: softmax and cross-entropy over the first V of Vp logits, and
// in the same pass dlogits = (softmax - onehot) * dloss (0 past V) unless
// dlogits is NULL. losses[m] gets each token's loss. dlogits may alias logits.

template <typename T>
void crossentropy_forward_backward(T* dlogits, T* losses, const T* logits, const int* targets, int M, int V, int Vp,
                                   float dloss) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const T* z = logits + (size_t)m * Vp;
        T maxval = -INFINITY;
        for (int i = 0; i < V; i++) { if (z[i] > maxval) { maxval = z[i]; } }
        T sum = 0;
        for (int i = 0; i < V; i++) { sum += exp(z[i] - maxval); }
        T lse = maxval + log(sum);
        losses[m] = lse - z[targets[m]];
        if (dlogits) {
            T* dz = dlogits + (size_t)m * Vp;
            for (int i = 0; i < V; i++) { dz[i] = (exp(z[i] - lse) - (i == targets[m])) * (T)dloss; }
            for (int i = V; i < Vp; i++) { dz[i] = 0; }
        }
    }
}

// ----------------------------------------------------------------------------
// the statistics of one forward, added to per-step sums in a fixed order:
// acc[0] += sum of the token losses; per layer l, acc[1 + 3l] += sum_m row_l1,
// acc[2 + 3l] += firing (token, unit) pairs, acc[3 + 3l] = max(.., most firing
// units of a token). row_l1 and row_active are [L, M].

template <typename T>
void forward_stats_accumulate(double* acc, const T* losses, const T* row_l1, const int* row_active, int L, int M) {
    double loss = 0;
    for (int m = 0; m < M; m++) { loss += losses[m]; }
    acc[0] += loss;
    for (int l = 0; l < L; l++) {
        double l1 = 0, active = 0, most = acc[3 + 3 * l];
        for (int m = 0; m < M; m++) {
            l1 += row_l1[(size_t)l * M + m];
            active += row_active[(size_t)l * M + m];
            if (row_active[(size_t)l * M + m] > most) { most = row_active[(size_t)l * M + m]; }
        }
        acc[1 + 3 * l] += l1;
        acc[2 + 3 * l] += active;
        acc[3 + 3 * l] = most;
    }
}

#endif // LLMC_CPU_OPS_H
