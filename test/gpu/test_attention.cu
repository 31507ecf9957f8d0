/*
 The CUDA attention (llmc/cuda_attention.cuh) against the CPU reference
 attention_forward / attention_backward<float> of llmc/cpu_ops.h, on the same
 bf16 inputs, on every path that can take the shape on this GPU: hd 64 and 128
 run on the mma.sync path and, on a Hopper GPU, on the wgmma path too; other
 head sizes take the generic path.
 - fresh seeded random q, k, v, dout per case, over shapes that cover T = 1,
   T not a multiple of any tile (64 or 128 rows), GQA groups of 1 and 4
   (NH 8/2, 32/8, 4/1);
 - every output buffer (and the scratch) is filled with 0xFF bytes (NaN)
   before each run, so an element that is not written fails the NaN check;
 - a second run must give bit-identical out, lse and dqkv.
 The backward is checked on the GPU's own forward outputs (out, lse), so the
 two sides compute the same function of the same numbers.
*/
#include <vector>
#include "llmc/cpu_ops.h"
#include "llmc/cuda_attention.cuh"
#include "llmc/rng.h"
#include "test/gpu/gpu_util.cuh"
#include "test/test.h"

// Error of a tensor: max |gpu - ref| / max(max |ref|, floor). The inputs are
// exact in both computations; the GPU rounds P and dS to bf16 before the
// tensor-core products (relative 2^-9 per element) and rounds its outputs to
// bf16 (2^-9), with fp32 accumulation throughout. Those errors have random
// signs and add up to a few 1e-3 of the largest element; a wrong index or a
// missed key gives errors of order 1. 2e-2 leaves room for the worst element
// of the largest case. lse stays fp32 end to end: 1e-4.
// The floor: at T = 1 the true dq and dk are 0 (a softmax over one key is
// constant) and both sides return the fp32 noise of dp - delta, about 1e-5;
// real gradients of these inputs are far above 1e-3.
static const double kTolerance = 2e-2, kLseTolerance = 1e-4, kFloor = 1e-3;

static double max_rel_error(const float* gpu, const float* ref, size_t n, int* nan_count) {
    double worst = 0, largest = kFloor;
    for (size_t i = 0; i < n; i++) {
        if (isnan(gpu[i])) { (*nan_count)++; continue; }
        worst = fmax(worst, fabs((double)gpu[i] - ref[i]));
        largest = fmax(largest, fabs((double)ref[i]));
    }
    return worst / largest;
}

static void to_float(float* dst, const bf16* src, size_t n) {
    for (size_t i = 0; i < n; i++) { dst[i] = __bfloat162float(src[i]); }
}

// fills x with N(0, sigma^2) rounded to bf16, and its float copy
static void random_bf16(std::vector<bf16>& x, std::vector<float>& xf, double sigma, uint64_t* rng) {
    for (size_t i = 0; i < x.size(); i++) {
        x[i] = __float2bfloat16((float)(sigma * rng_normal(rng)));
        xf[i] = __bfloat162float(x[i]);
    }
}

typedef struct { int B, T, NH, NKV, hd; double sigma; } Case;

static const char* path_name(attention_detail::Path path) {
    return path == attention_detail::kWgmmaPath ? "wgmma" : path == attention_detail::kMmaPath ? "mma" : "generic";
}

// one case on one path: runs, checks, prints its part of the case's line
static void test_path(const Case* c, attention_detail::Path path, const std::vector<bf16>& qkv,
                      const std::vector<float>& qkv_f, const std::vector<bf16>& dout,
                      const std::vector<float>& dout_f) {
    int B = c->B, T = c->T, NH = c->NH, NKV = c->NKV, hd = c->hd;
    size_t M = (size_t)B * T, D = (size_t)NH * hd, QKV = D + 2 * (size_t)NKV * hd;
    size_t n_qkv = M * QKV, n_out = M * D, n_lse = M * NH;

    bf16* d_qkv = upload(qkv);
    bf16* d_dout = upload(dout);
    bf16* d_out = (bf16*)cuda_malloc(n_out * sizeof(bf16));
    bf16* d_dqkv = (bf16*)cuda_malloc(n_qkv * sizeof(bf16));
    float* d_lse = (float*)cuda_malloc(n_lse * sizeof(float));
    float* d_scratch = (float*)cuda_malloc(n_lse * sizeof(float)); // B*T*NH floats, as documented

    // two runs from poisoned buffers: the first is checked, the second must repeat it bit for bit
    std::vector<bf16> out[2], dqkv[2];
    std::vector<float> lse[2];
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemset(d_out, 0xFF, n_out * sizeof(bf16)));
        cudaCheck(cudaMemset(d_lse, 0xFF, n_lse * sizeof(float)));
        cudaCheck(cudaMemset(d_dqkv, 0xFF, n_qkv * sizeof(bf16)));
        cudaCheck(cudaMemset(d_scratch, 0xFF, n_lse * sizeof(float)));
        attention_detail::attention_forward_on(path, d_out, d_lse, d_qkv, B, T, NH, NKV, hd);
        attention_detail::attention_backward_on(path, d_dqkv, d_scratch, d_dout, d_out, d_qkv, d_lse, B, T, NH, NKV,
                                                hd);
        cudaCheck(cudaDeviceSynchronize());
        out[run] = download(d_out, n_out);
        lse[run] = download(d_lse, n_lse);
        dqkv[run] = download(d_dqkv, n_qkv);
    }

    // the CPU reference: the forward on the same inputs, the backward on this path's out and lse
    std::vector<float> out_ref(n_out), lse_ref(n_lse), out_gpu(n_out), dqkv_ref(n_qkv), dqkv_gpu(n_qkv);
    std::vector<float> cpu_scratch((size_t)B * NKV * T);
    attention_forward(out_ref.data(), lse_ref.data(), qkv_f.data(), B, T, NH, NKV, hd);
    to_float(out_gpu.data(), out[0].data(), n_out);
    attention_backward(dqkv_ref.data(), cpu_scratch.data(), dout_f.data(), out_gpu.data(), qkv_f.data(),
                       lse[0].data(), B, T, NH, NKV, hd);
    to_float(dqkv_gpu.data(), dqkv[0].data(), n_qkv);

    int nans = 0;
    double err_out = max_rel_error(out_gpu.data(), out_ref.data(), n_out, &nans);
    double err_lse = max_rel_error(lse[0].data(), lse_ref.data(), n_lse, &nans);
    // dq, dk, dv are separate tensors with their own scales: split the rows
    std::vector<float> parts_gpu[3], parts_ref[3];
    size_t offsets[4] = {0, D, D + (size_t)NKV * hd, QKV};
    for (int p = 0; p < 3; p++) {
        for (size_t m = 0; m < M; m++) {
            for (size_t i = offsets[p]; i < offsets[p + 1]; i++) {
                parts_gpu[p].push_back(dqkv_gpu[m * QKV + i]);
                parts_ref[p].push_back(dqkv_ref[m * QKV + i]);
            }
        }
    }
    double err_d[3];
    for (int p = 0; p < 3; p++) {
        err_d[p] = max_rel_error(parts_gpu[p].data(), parts_ref[p].data(), parts_gpu[p].size(), &nans);
    }
    bool same = memcmp(out[0].data(), out[1].data(), n_out * sizeof(bf16)) == 0 &&
                memcmp(lse[0].data(), lse[1].data(), n_lse * sizeof(float)) == 0 &&
                memcmp(dqkv[0].data(), dqkv[1].data(), n_qkv * sizeof(bf16)) == 0;

    char name[96];
    snprintf(name, sizeof(name), "B%d T%d NH%d/%d hd%d sigma%.1f %s", B, T, NH, NKV, hd, c->sigma, path_name(path));
    printf(" | %s %.1e %.1e %.1e %.1e %.1e%s%s", path_name(path), err_out, err_lse, err_d[0], err_d[1], err_d[2],
           nans ? " NaN" : "", same ? "" : " NOT DETERMINISTIC");
    CHECK(nans == 0, "%s: %d NaNs (unwritten or overflowed elements)", name, nans);
    CHECK(err_out < kTolerance, "%s: out error %g", name, err_out);
    CHECK(err_lse < kLseTolerance, "%s: lse error %g", name, err_lse);
    CHECK(err_d[0] < kTolerance, "%s: dq error %g", name, err_d[0]);
    CHECK(err_d[1] < kTolerance, "%s: dk error %g", name, err_d[1]);
    CHECK(err_d[2] < kTolerance, "%s: dv error %g", name, err_d[2]);
    CHECK(same, "%s: a second run gave different bits", name);

    cuda_free(d_qkv);
    cuda_free(d_dout);
    cuda_free(d_out);
    cuda_free(d_dqkv);
    cuda_free(d_lse);
    cuda_free(d_scratch);
}

// one line per case: the errors on each path
static void test_case(const Case* c, uint64_t seed) {
    using namespace attention_detail;
    size_t M = (size_t)c->B * c->T, QKV = (size_t)(c->NH + 2 * c->NKV) * c->hd;
    uint64_t rng = seed;
    // q and k of std sigma make scores of std sigma^2: sigma > 1 tests peaked softmaxes
    std::vector<bf16> qkv(M * QKV), dout(M * c->NH * c->hd);
    std::vector<float> qkv_f(qkv.size()), dout_f(dout.size());
    random_bf16(qkv, qkv_f, c->sigma, &rng);
    random_bf16(dout, dout_f, 1.0, &rng);

    printf("B%d T%d NH%d/%d hd%d s%.1f", c->B, c->T, c->NH, c->NKV, c->hd, c->sigma);
    if (c->hd == 64 || c->hd == 128) {
        test_path(c, kMmaPath, qkv, qkv_f, dout, dout_f);
        if (device_has_wgmma()) { test_path(c, kWgmmaPath, qkv, qkv_f, dout, dout_f); }
    } else {
        test_path(c, kGenericPath, qkv, qkv_f, dout, dout_f);
    }
    printf("\n");
    fflush(stdout);
}

int main(void) {
    const Case cases[] = {
        // the tensor-core paths: hd 64 and 128
        {1, 1, 4, 4, 64, 1.0}, {2, 1, 8, 2, 128, 1.0},
        {2, 17, 4, 4, 64, 1.0}, {1, 17, 32, 8, 128, 1.0},
        {3, 64, 8, 2, 64, 1.0}, {1, 64, 4, 4, 128, 2.0},
        {2, 100, 32, 8, 64, 1.0}, {4, 100, 8, 2, 128, 1.0},
        {2, 129, 8, 2, 64, 1.0}, {1, 129, 4, 4, 128, 1.0},
        {1, 256, 4, 4, 64, 2.0}, {2, 256, 32, 8, 128, 1.0},
        {2, 300, 8, 2, 64, 1.0}, {1, 390, 4, 1, 128, 1.5},
        {1, 1024, 8, 2, 64, 1.0}, {2, 1024, 4, 4, 128, 1.0}, {1, 1024, 32, 8, 128, 2.0},
        {1, 1000, 8, 2, 64, 1.5}, {4, 200, 4, 4, 128, 1.0},
        {2, 2048, 16, 16, 128, 1.0}, {1, 2048, 32, 32, 64, 1.0},
        // the generic path: other head sizes
        {2, 100, 8, 2, 32, 1.0}, {1, 130, 4, 4, 48, 1.0}, {1, 65, 6, 2, 96, 2.0}, {2, 17, 2, 1, 2, 1.0},
        {1, 1, 4, 2, 34, 1.0},
    };
    printf("errors of out, lse, dq, dk, dv on each path\n");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) { test_case(&cases[i], 1000 + i); }
    return test_summary("test_attention");
}
