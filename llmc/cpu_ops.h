/*
 The CPU reference kernels: every layer of the model, forward and backward, in
 plain C++ with OpenMP. They are templates over the element type T: float for
 the CPU training path, double for the finite-difference gradient checks.

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

// out[M,N] = inp[M,K] w[N,K]^T: a linear layer in the PyTorch weight layout
template <typename T>
void matmul_forward(T* out, const T* inp, const T* w, int M, int K, int N) {
    gemm_nt(out, inp, w, M, N, K, 0);
}

// dinp[M,K] += dout[M,N] w[N,K];  dw[N,K] += dout^T inp
template <typename T>
void matmul_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, int M, int K, int N) {
    gemm_nn(dinp, dout, w, M, K, N, 1);
    gemm_tn(dw, dout, inp, N, K, M, 1);
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

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int M, int D, float eps) {
    #pragma omp parallel for
    for (int m = 0; m < M; m++) {
        const T* x = inp + (size_t)m * D;
        T r = 1 / sqrt(dot(x, x, D) / D + (T)eps);
        T* o = out + (size_t)m * D;
        for (int i = 0; i < D; i++) { o[i] = x[i] * r * w[i]; }
        if (rstd) { rstd[m] = r; }
    }
}

// dinp += rstd * (dout*w - n * mean(dout*w*n)) with n = x*rstd;  dw += sum_m dout*n
template <typename T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int M, int D) {
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
// angle pos * theta^(-2i/hd). Applied in place to the q and k parts of the fused
// qkv rows; token m of sequence b sits at position pos0 + t.

template <typename T>
void rope_rotate(T* qkv, int B, int T_, int pos0, int stride, int NH, int NKV, int hd, float theta, int inverse) {
    int half = hd / 2;
    int heads = NH + NKV; // q heads, then k heads, are contiguous at the start of the row
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

// ----------------------------------------------------------------------------
// causal grouped-query attention. Query row t of sequence b (absolute position
// pos0 + t) attends to keys 0..pos0+t; query head h reads key/value head
// h / (NH/NKV). q rows have stride q_stride, k and v rows kv_stride, and a
// sequence's k/v rows start kv_batch_stride elements apart.
// probs[b, h, t, 0..Tk) holds softmax(q k^T / sqrt(hd)), Tk = pos0 + Tq.

typedef struct {
    int B, Tq, pos0, NH, NKV, hd;
    int q_stride, kv_stride, out_stride;
    size_t q_batch_stride, kv_batch_stride, out_batch_stride;
} AttentionShape;

template <typename T>
void attention_forward(T* out, T* probs, const T* q, const T* k, const T* v, AttentionShape s) {
    int Tk = s.pos0 + s.Tq, group = s.NH / s.NKV;
    T scale = 1 / sqrt((T)s.hd);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            for (int t = 0; t < s.Tq; t++) {
                const T* qt = q + b * s.q_batch_stride + (size_t)t * s.q_stride + h * s.hd;
                const T* kb = k + b * s.kv_batch_stride + (h / group) * s.hd;
                const T* vb = v + b * s.kv_batch_stride + (h / group) * s.hd;
                T* p = probs + (((size_t)b * s.NH + h) * s.Tq + t) * Tk;
                int last = s.pos0 + t;
                T maxval = -INFINITY;
                for (int j = 0; j <= last; j++) {
                    p[j] = dot(qt, kb + (size_t)j * s.kv_stride, s.hd) * scale;
                    if (p[j] > maxval) { maxval = p[j]; }
                }
                T sum = 0;
                for (int j = 0; j <= last; j++) { p[j] = exp(p[j] - maxval); sum += p[j]; }
                for (int j = 0; j <= last; j++) { p[j] /= sum; }
                for (int j = last + 1; j < Tk; j++) { p[j] = 0; }
                T* o = out + b * s.out_batch_stride + (size_t)t * s.out_stride + h * s.hd;
                for (int i = 0; i < s.hd; i++) { o[i] = 0; }
                for (int j = 0; j <= last; j++) {
                    const T* vj = vb + (size_t)j * s.kv_stride;
                    for (int i = 0; i < s.hd; i++) { o[i] += p[j] * vj[i]; }
                }
            }
        }
    }
}

// Backward of the training case (pos0 = 0, q/k/v and their gradients in fused
// qkv rows). dqkv must be zeroed: each thread owns one (sequence, kv head) and
// accumulates dk, dv over the query heads of its group.
template <typename T>
void attention_backward(T* dqkv, T* dprobs_scratch, const T* dout, const T* qkv, const T* probs,
                        int B, int T_, int NH, int NKV, int hd) {
    int D = NH * hd, KVD = NKV * hd, QKV = D + 2 * KVD, group = NH / NKV;
    T scale = 1 / sqrt((T)hd);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            T* dp = dprobs_scratch + ((size_t)b * NKV + kvh) * T_;
            const T* base = qkv + (size_t)b * T_ * QKV;
            T* dbase = dqkv + (size_t)b * T_ * QKV;
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int t = 0; t < T_; t++) {
                    const T* p = probs + (((size_t)b * NH + h) * T_ + t) * T_;
                    const T* dot_ = dout + ((size_t)b * T_ + t) * D + h * hd;
                    const T* qt = base + (size_t)t * QKV + h * hd;
                    T* dqt = dbase + (size_t)t * QKV + h * hd;
                    // dp = do . v_j, dv_j += p_j do
                    T pdp = 0;
                    for (int j = 0; j <= t; j++) {
                        const T* vj = base + (size_t)j * QKV + D + KVD + kvh * hd;
                        T* dvj = dbase + (size_t)j * QKV + D + KVD + kvh * hd;
                        dp[j] = dot(dot_, vj, hd);
                        pdp += p[j] * dp[j];
                        for (int i = 0; i < hd; i++) { dvj[i] += p[j] * dot_[i]; }
                    }
                    // softmax backward: ds_j = p_j (dp_j - sum p dp); then through q k^T * scale
                    for (int j = 0; j <= t; j++) {
                        T ds = p[j] * (dp[j] - pdp) * scale;
                        const T* kj = base + (size_t)j * QKV + D + kvh * hd;
                        T* dkj = dbase + (size_t)j * QKV + D + kvh * hd;
                        for (int i = 0; i < hd; i++) {
                            dqt[i] += ds * kj[i];
                            dkj[i] += ds * qt[i];
                        }
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// the ReLU-gated FFN activation h = relu(g) * u, with what the L1 term and the
// sparsity statistics need: sum |h|, per-token count of firing units (g > 0),
// and a per-unit "fired at least once" mark.

typedef struct {
    double l1_sum;   // sum over tokens and units of |h|
    long long active; // firing (token, unit) pairs
    int max_active;  // most firing units of any token
} GateStats;

template <typename T>
GateStats relu_gate_forward(T* h, const T* g, const T* u, uint8_t* fired, int M, int H) {
    GateStats st = {0.0, 0, 0};
    double l1 = 0;
    long long active = 0;
    int max_active = 0;
    #pragma omp parallel for reduction(+:l1, active) reduction(max:max_active)
    for (int m = 0; m < M; m++) {
        const T* gm = g + (size_t)m * H;
        const T* um = u + (size_t)m * H;
        T* hm = h + (size_t)m * H;
        int count = 0;
        T row_l1 = 0;
        for (int n = 0; n < H; n++) {
            T a = gm[n] > 0 ? gm[n] : 0;
            hm[n] = a * um[n];
            row_l1 += fabs(hm[n]);
            count += gm[n] > 0;
        }
        l1 += row_l1;
        active += count;
        if (count > max_active) { max_active = count; }
    }
    // marking is separate so the parallel loop above has no shared writes
    if (fired) {
        #pragma omp parallel for
        for (int n = 0; n < H; n++) {
            if (fired[n]) { continue; }
            for (int m = 0; m < M; m++) {
                if (g[(size_t)m * H + n] > 0) { fired[n] = 1; break; }
            }
        }
    }
    st.l1_sum = l1;
    st.active = active;
    st.max_active = max_active;
    return st;
}

// with dh_total = dh + l1_scale * sign(h):  du = dh_total * relu(g),  dg = dh_total * u * [g > 0]
// (dh and dg may alias: each element is read before it is written)
template <typename T>
void relu_gate_backward(T* dg, T* du, const T* dh, const T* g, const T* u, const T* h, T l1_scale, int M, int H) {
    #pragma omp parallel for
    for (size_t i = 0; i < (size_t)M * H; i++) {
        T sign = h[i] > 0 ? 1 : (h[i] < 0 ? -1 : 0);
        T d = dh[i] + l1_scale * sign;
        T active = g[i] > 0;
        du[i] = d * g[i] * active;
        dg[i] = d * u[i] * active;
    }
}

// ----------------------------------------------------------------------------
// residual add: x += y

template <typename T>
void residual_add(T* x, const T* y, size_t n) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) { x[i] += y[i]; }
}

// ----------------------------------------------------------------------------
// the classifier: softmax and cross-entropy over the first V of Vp logits, and
// in the same pass dlogits = (softmax - onehot) * dloss (0 past V). Returns the
// summed loss; losses[m] gets each token's loss. dlogits may alias logits.

template <typename T>
double crossentropy_forward_backward(T* dlogits, float* losses, const T* logits, const int* targets,
                                     int M, int V, int Vp, T dloss) {
    double total = 0;
    #pragma omp parallel for reduction(+:total)
    for (int m = 0; m < M; m++) {
        const T* z = logits + (size_t)m * Vp;
        T maxval = -INFINITY;
        for (int i = 0; i < V; i++) { if (z[i] > maxval) { maxval = z[i]; } }
        T sum = 0;
        for (int i = 0; i < V; i++) { sum += exp(z[i] - maxval); }
        T lse = maxval + log(sum);
        T loss = lse - z[targets[m]];
        if (losses) { losses[m] = (float)loss; }
        total += loss;
        if (dlogits) {
            T* dz = dlogits + (size_t)m * Vp;
            for (int i = 0; i < V; i++) {
                dz[i] = (exp(z[i] - lse) - (i == targets[m])) * dloss;
            }
            for (int i = V; i < Vp; i++) { dz[i] = 0; }
        }
    }
    return total;
}

#endif // LLMC_CPU_OPS_H
