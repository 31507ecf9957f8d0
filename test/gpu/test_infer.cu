/*
 GPU inference (the cached forward of llmc/gpt.h on GPT<bf16, float>, and its
 decode kernels) against the CPU reference path (the same forward on
 GPT<float, float>, fp32 on the same bf16-rounded weights), on fresh random
 inputs:
 - decode attention (RoPE of q and the new k inside) against the CPU RoPE and
   an fp64 softmax over each sequence's cache (positions 0, 17, 128, 299: one
   key, one split, just past a split, the whole cache of 300), head sizes 16,
   32, 64, 128, and the new k, v it stores in the cache (poisoned before); the
   rows' sequences in slots 4, 0, 5, 2 of 6 give the bits of slots 0..3, and
   the slots no row names are left as they were;
 - the prefill's RoPE and cache writes against rope_forward, bit for bit
   (head sizes 24, 64, 128: both widths of the kernel), nothing else written;
 - prompts prefilled in chunks (a server's), past position 0 over the cache:
   every row's attention against an fp64 softmax, the cache the bits of a
   one-shot prefill;
 - the decode linear layer (GEMV for 1 and 3 rows; for 4, 9 and 16 decode_mma where it fits, else
   cuBLASLt) against fp64, decode_mma's rows the same bits at 4, 9 and 16 rows;
 - the sparse decode FFN against an fp64 FFN over the units with g > 0 (g
   rounded to bf16 as the GPU rounds it), activity none, ~1%, ~50% and all
   units (docs/SPARSE.md's carrier construction), D 320 and 2312 (not
   multiples of the kernel's 256 columns): g given, then up (which lists g > 0)
   and down, batches 1, 3, 8, 9, 64, the active counts exact; on compute
   capability 9.0 up and down in a cluster per row (sparse_up_down_kernel), y
   the list path's bits; and for 1 and 3 the GEMV with the gate + up epilogue
   (every h written, poisoned before), then down from the nonzero h; all count
   the fired units exactly;
 - the whole model: a batch of prompts of different lengths (1, 5, 17 tokens)
   prefilled at once, then decode steps, logits of every step against the CPU
   path, FFN dense and TwELL (sparse forced, and auto), on random weights
   (half the units fire: every TwELL tile overflows, computed from records)
   and on the synthetic-sparse init (few units fire); TwELL with blocks of
   one slot and one record, grown until exact; the decode step as a graph
   and launched directly, bit-identical; a SiLU model with an untied head
   (Llama's) on the dense FFN, its logits from lm_head; continuous batching
   (sequences in any slots, chunked prefills, decode batches that change)
   against the CPU path doing the same, dense and sparse, graphs per batch
   size = direct launches, and the fired units counted as the CPU counts them.
 Logits are bf16 after two bf16 layers: max|gpu - cpu| / max|cpu| < 3e-2 (a
 wrong index or a missing unit is O(1)). Every output is poisoned (0xFF, NaN)
 before each run, and a NaN fails.
*/
#include <algorithm>
#include <vector>
#include "llmc/inference.h"
#include "llmc/synthetic.h"
#include "test/gpu/gpu_util.cuh"
#include "test/test.h"

// max |a - b| / max |b|, infinite if a holds a NaN
static double max_rel_err(const float* a, const double* b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) { return INFINITY; }
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    return diff / fmax(scale, 1e-30);
}

static std::vector<bf16> random_bf16(size_t n, double std, uint64_t* rng) {
    std::vector<bf16> x(n);
    for (size_t i = 0; i < n; i++) { x[i] = __float2bfloat16((float)(std * rng_normal(rng))); }
    return x;
}

// cache_len 300: positions 0, 17, 128, 299 (one key; one split; just past a split; the whole cache); 1100:
// 1099, 700, 1023, 5 (nine splits, past the combine's unrolled eight; six; eight whole ones; one); 2048: 200,
// 17, 128, 5 (a context bound of 256 positions: two splits launched of the cache's 16). The rows run twice,
// once launched for the whole cache and once for the bound their positions reach
// (attention_decode_context), with the same bits
static void test_decode_attention(int cache_len) {
    uint64_t rng = 101 + cache_len;
    const float theta = 10000.0f;
    for (int hd : {16, 32, 64, 128}) {
        const int NH = 4, NKV = 2, B = 4, S = 6, QKV = (NH + 2 * NKV) * hd, KVD = NKV * hd;
        const size_t seq_size = (size_t)cache_len * KVD;
        std::vector<int> pos = cache_len == 300    ? std::vector<int>{0, 17, 128, 299}
                               : cache_len == 1100 ? std::vector<int>{1099, 700, 1023, 5}
                                                   : std::vector<int>{200, 17, 128, 5};
        const int longest = *std::max_element(pos.begin(), pos.end()) + 1;
        const int bound = attention_decode_context(attention_decode_class(longest), cache_len);
        std::vector<int> slots = {4, 0, 5, 2};    // row b's cache slot (1 and 3 are other sequences')
        std::vector<bf16> qkv = random_bf16((size_t)B * QKV, 1.0, &rng);
        std::vector<bf16> seq_k = random_bf16((size_t)B * seq_size, 1.0, &rng); // row b's sequence, [cache_len, KVD]
        std::vector<bf16> seq_v = random_bf16((size_t)B * seq_size, 1.0, &rng);
        for (int b = 0; b < B; b++) { // the new position's entries are the kernel's to write
            for (int i = 0; i < KVD; i++) {
                seq_k[b * seq_size + (size_t)pos[b] * KVD + i] = __float2bfloat16(NAN);
                seq_v[b * seq_size + (size_t)pos[b] * KVD + i] = __float2bfloat16(NAN);
            }
        }
        // the decode of the B rows with row b's sequence in slot at[b] of a cache of S slots (the others random),
        // launched for context positions; out, and the cache of each row's slot afterwards
        auto run = [&](const std::vector<int>& at, int context, std::vector<float>* out, std::vector<float>* kc_rows,
                       std::vector<float>* vc_rows, bool* others_kept) {
            std::vector<bf16> kc = random_bf16((size_t)S * seq_size, 1.0, &rng), vc = random_bf16((size_t)S * seq_size, 1.0, &rng);
            for (int b = 0; b < B; b++) {
                std::copy(seq_k.begin() + b * seq_size, seq_k.begin() + (b + 1) * seq_size, kc.begin() + at[b] * seq_size);
                std::copy(seq_v.begin() + b * seq_size, seq_v.begin() + (b + 1) * seq_size, vc.begin() + at[b] * seq_size);
            }
            bf16 *qkv_d = upload(qkv), *kc_d = upload(kc), *vc_d = upload(vc);
            int *pos_d = upload(pos), *slot_d = upload(at);
            bf16* out_d = (bf16*)cuda_malloc((size_t)B * NH * hd * sizeof(bf16));
            size_t splits = (size_t)B * NH * attention_decode_splits(cache_len);
            float* part_o = (float*)cuda_malloc(splits * hd * sizeof(float));
            float* part_ml = (float*)cuda_malloc(splits * 2 * sizeof(float));
            cudaCheck(cudaMemset(out_d, 0xFF, (size_t)B * NH * hd * sizeof(bf16)));
            cudaCheck(cudaMemset(part_o, 0xFF, splits * hd * sizeof(float)));
            cudaCheck(cudaMemset(part_ml, 0xFF, splits * 2 * sizeof(float)));
            int* splits_done = (int*)cuda_malloc((size_t)B * NH * sizeof(int));
            cudaCheck(cudaMemset(splits_done, 0, (size_t)B * NH * sizeof(int)));
            attention_decode(out_d, part_o, part_ml, splits_done, qkv_d, kc_d, vc_d, slot_d, pos_d, B, NH, NKV, hd,
                             cache_len, context, theta);
            std::vector<int> left = download(splits_done, (size_t)B * NH);
            CHECK(std::count(left.begin(), left.end(), 0) == B * NH, "decode attention hd %d: the split counters end at zero", hd);
            *out = to_float(download(out_d, (size_t)B * NH * hd));
            std::vector<bf16> kc_gpu = download(kc_d, kc.size()), vc_gpu = download(vc_d, vc.size());
            kc_rows->clear();
            vc_rows->clear();
            *others_kept = true;
            for (int sl = 0; sl < S; sl++) {
                int row = (int)(std::find(at.begin(), at.end(), sl) - at.begin());
                if (row == B) { // no row's: untouched
                    *others_kept &= memcmp(kc_gpu.data() + sl * seq_size, kc.data() + sl * seq_size, seq_size * sizeof(bf16)) == 0 &&
                                    memcmp(vc_gpu.data() + sl * seq_size, vc.data() + sl * seq_size, seq_size * sizeof(bf16)) == 0;
                }
            }
            for (int b = 0; b < B; b++) {
                std::vector<float> k = to_float(std::vector<bf16>(kc_gpu.begin() + at[b] * seq_size, kc_gpu.begin() + (at[b] + 1) * seq_size));
                std::vector<float> v = to_float(std::vector<bf16>(vc_gpu.begin() + at[b] * seq_size, vc_gpu.begin() + (at[b] + 1) * seq_size));
                kc_rows->insert(kc_rows->end(), k.begin(), k.end());
                vc_rows->insert(vc_rows->end(), v.begin(), v.end());
            }
            cuda_free(qkv_d); cuda_free(kc_d); cuda_free(vc_d); cuda_free(pos_d); cuda_free(slot_d); cuda_free(out_d);
            cuda_free(part_o); cuda_free(part_ml); cuda_free(splits_done);
        };
        std::vector<float> out, kc_gpu, vc_gpu, out_b, kc_b, vc_b;
        bool others_kept = false, others_kept_b = false;
        run(slots, cache_len, &out, &kc_gpu, &vc_gpu, &others_kept);
        run({0, 1, 2, 3}, bound, &out_b, &kc_b, &vc_b, &others_kept_b);
        CHECK(others_kept && others_kept_b, "decode attention hd %d: a slot no row names was written", hd);
        auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
            return x.size() == y.size() && memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
        };
        CHECK(same_bits(out, out_b) && same_bits(kc_gpu, kc_b) && same_bits(vc_gpu, vc_b),
              "decode attention hd %d: rows in slots 4, 0, 5, 2 (the whole cache's splits) differ from the same rows in "
              "slots 0..3 (the splits of %d positions)", hd, bound);
        // the reference: q and the new k turned at pos[b] (the CPU RoPE), the new k and v at pos[b]
        std::vector<float> q = to_float(qkv), k = to_float(seq_k), v = to_float(seq_v);
        double cache_err = 0;
        for (int b = 0; b < B; b++) {
            float* row = q.data() + (size_t)b * QKV;
            rope_forward(row, 1, 1, pos[b], NH, NKV, hd, theta);
            for (int i = 0; i < KVD; i++) {
                size_t c = b * seq_size + (size_t)pos[b] * KVD + i;
                k[c] = __bfloat162float(__float2bfloat16(row[NH * hd + i]));
                v[c] = row[(NH + NKV) * hd + i];
                cache_err = fmax(cache_err, fabs(kc_gpu[c] - k[c]) + fabs(vc_gpu[c] - v[c]));
                if (isnan(kc_gpu[c]) || isnan(vc_gpu[c])) { cache_err = INFINITY; }
            }
        }
        std::vector<double> ref((size_t)B * NH * hd, 0.0);
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                int kvh = h / (NH / NKV), n = pos[b] + 1;
                std::vector<double> sc(n);
                double mx = -INFINITY, sum = 0;
                for (int t = 0; t < n; t++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++) {
                        dot += (double)q[(size_t)b * QKV + h * hd + d] * k[b * seq_size + (size_t)t * KVD + kvh * hd + d];
                    }
                    sc[t] = dot / sqrt((double)hd);
                    mx = fmax(mx, sc[t]);
                }
                for (int t = 0; t < n; t++) { sc[t] = exp(sc[t] - mx); sum += sc[t]; }
                for (int d = 0; d < hd; d++) {
                    double o = 0;
                    for (int t = 0; t < n; t++) { o += sc[t] * v[b * seq_size + (size_t)t * KVD + kvh * hd + d]; }
                    ref[(size_t)b * NH * hd + h * hd + d] = o / sum;
                }
            }
        }
        double e = max_rel_err(out.data(), ref.data(), ref.size());
        CHECK(e < 1e-2, "decode attention hd %d, cache %d: rel err %g", hd, cache_len, e);
        CHECK(cache_err < 3e-2, "decode attention hd %d: the new k, v in the cache differ by %g", hd, cache_err);
        printf("  decode attention + RoPE hd %3d, positions %d/%d/%d/%d of %d in slots 4/0/5/2: rel err %.2e, new "
               "cache entries within %.1e, the same bits in slots 0..3 launched for %d positions\n", hd, pos[0], pos[1],
               pos[2], pos[3], cache_len, e, cache_err, bound);
    }
}

// the prefill's RoPE and cache writes (attention_prefill) against rope_forward,
// bit for bit: q and k turned in place, k and v in the cache of the prompt's
// slot at its positions and nothing else written (both the 16-byte path and,
// at hd 24, the one-pair path)
static void test_prefill_rope_cache(void) {
    uint64_t rng = 202;
    const float theta = 10000.0f;
    for (int hd : {24, 64, 128}) {
        const int NH = 4, NKV = 2, T = 37, slots = 2, cache_len = 64, QKV = (NH + 2 * NKV) * hd, KVD = NKV * hd;
        std::vector<bf16> qkv = random_bf16((size_t)T * QKV, 1.0, &rng);
        std::vector<int> slot(T, 1), pos(T), seq_rows = {0}, seq_lens = {T};
        for (int t = 0; t < T; t++) { pos[t] = t; }
        bf16 *qkv_d = upload(qkv), *turned_d = upload(qkv);
        int *slot_d = upload(slot), *pos_d = upload(pos);
        rope_forward(turned_d, 1, T, 0, NH, NKV, hd, theta);
        size_t cache_n = (size_t)slots * cache_len * KVD;
        bf16* kc_d = (bf16*)cuda_malloc(cache_n * sizeof(bf16));
        bf16* vc_d = (bf16*)cuda_malloc(cache_n * sizeof(bf16));
        cudaCheck(cudaMemset(kc_d, 0xFF, cache_n * sizeof(bf16)));
        cudaCheck(cudaMemset(vc_d, 0xFF, cache_n * sizeof(bf16)));
        bf16* out_d = (bf16*)cuda_malloc((size_t)T * NH * hd * sizeof(bf16));
        float* lse_d = (float*)cuda_malloc((size_t)T * NH * sizeof(float));
        attention_prefill(out_d, lse_d, qkv_d, kc_d, vc_d, slot_d, pos_d, T, seq_rows.data(), seq_lens.data(), NULL, 1,
                          NH, NKV, hd, cache_len, theta);
        std::vector<bf16> got = download(qkv_d, qkv.size()), want = download(turned_d, qkv.size());
        std::vector<bf16> kc = download(kc_d, cache_n), vc = download(vc_d, cache_n);
        auto bits = [](bf16 x) { return __bfloat16_as_ushort(x); };
        size_t qkv_wrong = 0, cache_wrong = 0;
        for (size_t i = 0; i < qkv.size(); i++) { qkv_wrong += bits(got[i]) != bits(want[i]); }
        for (int s = 0; s < slots; s++) {
            for (int p = 0; p < cache_len; p++) {
                for (int c = 0; c < KVD; c++) {
                    size_t at = ((size_t)s * cache_len + p) * KVD + c;
                    bool written = s == 1 && p < T;
                    uint16_t k_want = written ? bits(want[(size_t)p * QKV + NH * hd + c]) : 0xFFFF;
                    uint16_t v_want = written ? bits(qkv[(size_t)p * QKV + (NH + NKV) * hd + c]) : 0xFFFF;
                    cache_wrong += (bits(kc[at]) != k_want) + (bits(vc[at]) != v_want);
                }
            }
        }
        CHECK(qkv_wrong == 0, "prefill RoPE hd %d: %zu of %zu q, k, v values differ from rope_forward's", hd, qkv_wrong,
              qkv.size());
        CHECK(cache_wrong == 0, "prefill cache hd %d: %zu of %zu cache values wrong", hd, cache_wrong, 2 * cache_n);
        cuda_free(qkv_d); cuda_free(turned_d); cuda_free(slot_d); cuda_free(pos_d); cuda_free(kc_d); cuda_free(vc_d);
        cuda_free(out_d); cuda_free(lse_d);
    }
    printf("prefill RoPE + cache writes: bit-identical to rope_forward, hd 24, 64, 128\n");
}

// Prompts prefilled in chunks, as a server does, two sequences in slots 2 and
// 0 of three: chunks that start at position 0 (the training kernel) and past
// it (chunk_attention_kernel over the cache), of 1 to 79 rows, chunks of both
// sequences in one call; every row's attention against an fp64 softmax over
// its sequence's turned keys up to its position (out poisoned before), and the
// cache the same bits as a one-shot prefill of the whole prompts leaves
static void test_chunk_attention(void) {
    uint64_t rng = 303;
    const float theta = 10000.0f;
    for (int hd : {16, 32, 64, 128}) {
        const int NH = 4, NKV = 2, S = 3, cache_len = 256, QKV = (NH + 2 * NKV) * hd, KVD = NKV * hd, D = NH * hd;
        const int lens[2] = {150, 40}, slot_of[2] = {2, 0};
        struct Chunk { int seq, start, len; };
        const std::vector<std::vector<Chunk>> calls = {{{0, 0, 70}, {1, 0, 17}}, {{0, 70, 1}, {1, 17, 23}}, {{0, 71, 79}}};
        std::vector<bf16> seq_qkv[2] = {random_bf16((size_t)lens[0] * QKV, 1.0, &rng),
                                        random_bf16((size_t)lens[1] * QKV, 1.0, &rng)};
        size_t cache_n = (size_t)S * cache_len * KVD;
        bf16 *kc_d = (bf16*)cuda_malloc(cache_n * sizeof(bf16)), *vc_d = (bf16*)cuda_malloc(cache_n * sizeof(bf16));
        float* lse_d = (float*)cuda_malloc((size_t)cache_len * NH * sizeof(float));
        // one call of chunks (or, for the cache check, of whole prompts); the turned q and out of each row land
        // in q_turned / out at the row's sequence and position
        std::vector<float> out[2] = {std::vector<float>((size_t)lens[0] * D), std::vector<float>((size_t)lens[1] * D)};
        std::vector<float> q_turned[2] = {std::vector<float>((size_t)lens[0] * QKV), std::vector<float>((size_t)lens[1] * QKV)};
        auto call = [&](const std::vector<Chunk>& chunks, bool starts_given) {
            std::vector<bf16> qkv;
            std::vector<int> slot, pos, rows, clens, starts;
            for (const Chunk& c : chunks) {
                rows.push_back((int)pos.size());
                clens.push_back(c.len);
                starts.push_back(c.start);
                qkv.insert(qkv.end(), seq_qkv[c.seq].begin() + (size_t)c.start * QKV,
                           seq_qkv[c.seq].begin() + (size_t)(c.start + c.len) * QKV);
                for (int t = 0; t < c.len; t++) { slot.push_back(slot_of[c.seq]); pos.push_back(c.start + t); }
            }
            int M = (int)pos.size();
            bf16* qkv_d = upload(qkv);
            int *slot_d = upload(slot), *pos_d = upload(pos);
            bf16* out_d = (bf16*)cuda_malloc((size_t)M * D * sizeof(bf16));
            cudaCheck(cudaMemset(out_d, 0xFF, (size_t)M * D * sizeof(bf16)));
            attention_prefill(out_d, lse_d, qkv_d, kc_d, vc_d, slot_d, pos_d, M, rows.data(), clens.data(),
                              starts_given ? starts.data() : NULL, (int)chunks.size(), NH, NKV, hd, cache_len, theta);
            std::vector<float> o = to_float(download(out_d, (size_t)M * D)), q = to_float(download(qkv_d, qkv.size()));
            for (size_t i = 0; i < chunks.size(); i++) {
                const Chunk& c = chunks[i];
                std::copy(o.begin() + (size_t)rows[i] * D, o.begin() + (size_t)(rows[i] + c.len) * D,
                          out[c.seq].begin() + (size_t)c.start * D);
                std::copy(q.begin() + (size_t)rows[i] * QKV, q.begin() + (size_t)(rows[i] + c.len) * QKV,
                          q_turned[c.seq].begin() + (size_t)c.start * QKV);
            }
            cuda_free(qkv_d); cuda_free(slot_d); cuda_free(pos_d); cuda_free(out_d);
        };
        cudaCheck(cudaMemset(kc_d, 0xFF, cache_n * sizeof(bf16)));
        cudaCheck(cudaMemset(vc_d, 0xFF, cache_n * sizeof(bf16)));
        for (const auto& chunks : calls) { call(chunks, true); }
        std::vector<bf16> kc = download(kc_d, cache_n), vc = download(vc_d, cache_n);
        double e = 0;
        for (int sq = 0; sq < 2; sq++) {
            std::vector<double> ref((size_t)lens[sq] * D);
            for (int p = 0; p < lens[sq]; p++) {
                for (int h = 0; h < NH; h++) {
                    const size_t base = (size_t)slot_of[sq] * cache_len * KVD + (h / (NH / NKV)) * hd;
                    std::vector<double> sc(p + 1);
                    double mx = -INFINITY, sum = 0;
                    for (int t = 0; t <= p; t++) {
                        double dot = 0;
                        for (int d = 0; d < hd; d++) {
                            dot += (double)q_turned[sq][(size_t)p * QKV + h * hd + d] *
                                   __bfloat162float(kc[base + (size_t)t * KVD + d]);
                        }
                        sc[t] = dot / sqrt((double)hd);
                        mx = fmax(mx, sc[t]);
                    }
                    for (int t = 0; t <= p; t++) { sc[t] = exp(sc[t] - mx); sum += sc[t]; }
                    for (int d = 0; d < hd; d++) {
                        double o = 0;
                        for (int t = 0; t <= p; t++) { o += sc[t] * __bfloat162float(vc[base + (size_t)t * KVD + d]); }
                        ref[(size_t)p * D + h * hd + d] = o / sum;
                    }
                }
            }
            e = fmax(e, max_rel_err(out[sq].data(), ref.data(), ref.size()));
        }
        CHECK(e < 1e-2, "chunked prefill attention hd %d: rel err %g", hd, e);
        cudaCheck(cudaMemset(kc_d, 0xFF, cache_n * sizeof(bf16)));
        cudaCheck(cudaMemset(vc_d, 0xFF, cache_n * sizeof(bf16)));
        call({{0, 0, lens[0]}, {1, 0, lens[1]}}, false);
        std::vector<bf16> kc_one = download(kc_d, cache_n), vc_one = download(vc_d, cache_n);
        CHECK(memcmp(kc_one.data(), kc.data(), cache_n * sizeof(bf16)) == 0 &&
              memcmp(vc_one.data(), vc.data(), cache_n * sizeof(bf16)) == 0,
              "chunked prefill hd %d: the cache differs from a one-shot prefill's", hd);
        printf("  chunked prefill attention hd %3d, chunks of 1 to 79 rows past position 0: rel err %.2e, the cache "
               "as a one-shot prefill's\n", hd, e);
        cuda_free(kc_d); cuda_free(vc_d); cuda_free(lse_d);
    }
}

// the decode linear layer (the GEMV for 1..GEMV_MAX_ROWS rows, decode_mma above where it fits, else cuBLASLt)
// against fp64; decode_mma's rows the same bits at any row count
static void test_decode_linear(void) {
    uint64_t rng = 505;
    // N 300: not a multiple of the GEMV's 8 warps nor of decode_mma's 16 rows; K 328 not a multiple of 32
    // (cuBLASLt); K 2080 one chunk past decode_mma's prefetch, K 5632 many
    const int shapes[3][2] = {{300, 328}, {300, 2080}, {2048, 5632}};
    for (const auto& shape : shapes) {
        const int N = shape[0], K = shape[1];
        std::vector<bf16> w = random_bf16((size_t)N * K, 1.0, &rng), x16 = random_bf16((size_t)16 * K, 1.0, &rng);
        bf16 *w_d = upload(w), *x_d = upload(x16);
        std::vector<float> wf = to_float(w), xf = to_float(x16);
        std::vector<bf16> y_mma16;
        for (int B : {16, 1, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 9}) {
            bf16* y_d = (bf16*)cuda_malloc((size_t)B * N * sizeof(bf16));
            cudaCheck(cudaMemset(y_d, 0xFF, (size_t)B * N * sizeof(bf16)));
            decode_linear(y_d, x_d, w_d, B, N, K);
            std::vector<bf16> yb = download(y_d, (size_t)B * N);
            std::vector<float> y = to_float(yb);
            std::vector<double> ref((size_t)B * N);
            for (int b = 0; b < B; b++) {
                for (int n = 0; n < N; n++) {
                    double sum = 0;
                    for (int k = 0; k < K; k++) { sum += (double)xf[(size_t)b * K + k] * wf[(size_t)n * K + k]; }
                    ref[(size_t)b * N + n] = sum;
                }
            }
            const bool mma = decode_mma_fits(B, N, K);
            double e = max_rel_err(y.data(), ref.data(), ref.size());
            CHECK(e < 1e-2, "decode linear B %d N %d K %d: rel err %g", B, N, K, e);
            if (mma && B == 16) { y_mma16 = yb; }
            if (mma && B < 16 && !y_mma16.empty()) {
                CHECK(memcmp(yb.data(), y_mma16.data(), yb.size() * sizeof(bf16)) == 0,
                      "decode linear (tensor cores) B %d N %d K %d: rows differ from the same rows' bits at B 16", B, N, K);
            }
            printf("  decode linear B %2d, N %4d, K %4d (%s): rel err %.2e\n", B, N, K,
                   gemv_fits(B, K) ? "GEMV" : mma ? "tensor cores" : "cuBLASLt", e);
            cuda_free(y_d);
        }
        cuda_free(x_d); cuda_free(w_d);
    }
}

static void test_sparse_decode_ffn(void) {
    using namespace sparse_decode_detail;
    uint64_t rng = 202;
    const double offsets[4][2] = {{0.0, 10.0}, {0.01, 2.326}, {0.5, 0.0}, {1.0, -10.0}}; // p, t = Phi^-1(1 - p)
    // H 6144: the down kernels' shared memory passes 48 KiB; D 2312: ten slices of 256 columns (the clusters'
    // blocks 0 and 1 take two, the last partial)
    for (int D : {320, 2312}) for (int H : {1024, 6144}) {
        sparse_down_allow_smem(H);
        for (int B : {1, 3, 8, 9, 64}) {
            if ((H > 1024 || D > 320) && B > 9) { continue; }
            if (D > 320 && H > 1024) { continue; }
            for (const auto& pt : offsets) {
                // f_b rows N(0, 1) with a carrier 1 in the last feature, Wg rows N(0, 1/(D-1)) with -t there
                std::vector<bf16> f = random_bf16((size_t)B * D, 1.0, &rng), wg = random_bf16((size_t)H * D, 1.0 / sqrt(D - 1), &rng);
                for (int b = 0; b < B; b++) { f[(size_t)b * D + D - 1] = __float2bfloat16(1.0f); }
                for (int n = 0; n < H; n++) { wg[(size_t)n * D + D - 1] = __float2bfloat16((float)-pt[1]); }
                std::vector<bf16> wu = random_bf16((size_t)H * D, 1.0 / sqrt(D), &rng);
                std::vector<bf16> wdT = random_bf16((size_t)H * D, 1.0 / sqrt(H), &rng);
                std::vector<float> ff = to_float(f), wgf = to_float(wg), wuf = to_float(wu), wdf = to_float(wdT);
                // the reference: g = bf16(f . Wg) as both GPU paths round it, then fp64
                std::vector<bf16> g((size_t)B * H);
                std::vector<double> ref((size_t)B * D, 0.0);
                std::vector<int> active(B, 0);
                std::vector<char> any(H, 0); // fired in some row
                for (int b = 0; b < B; b++) {
                    for (int n = 0; n < H; n++) {
                        double gd = 0, u = 0;
                        for (int d = 0; d < D; d++) { gd += (double)ff[(size_t)b * D + d] * wgf[(size_t)n * D + d]; }
                        g[(size_t)b * H + n] = __float2bfloat16((float)gd);
                        double gv = __bfloat162float(g[(size_t)b * H + n]);
                        if (!(gv > 0)) { continue; }
                        active[b]++;
                        any[n] = 1;
                        for (int d = 0; d < D; d++) { u += (double)ff[(size_t)b * D + d] * wuf[(size_t)n * D + d]; }
                        for (int d = 0; d < D; d++) { ref[(size_t)b * D + d] += gv * u * wdf[(size_t)n * D + d]; }
                    }
                }
                bf16 *f_d = upload(f), *wg_d = upload(wg), *wu_d = upload(wu), *wdT_d = upload(wdT), *g_d = upload(g);
                bf16* y_d = (bf16*)cuda_malloc((size_t)B * D * sizeof(bf16));
                int* list_d = (int*)cuda_malloc((size_t)B * H * sizeof(int));
                int* count_d = (int*)cuda_malloc(B * sizeof(int));
                float* a_d = (float*)cuda_malloc((size_t)B * H * sizeof(float));
                unsigned long long* fired_d = (unsigned long long*)cuda_malloc(2 * sizeof(unsigned long long));
                dim3 down_grid(ceil_div(D, SPARSE_DOWN_COLS), B);
                double mean_active = 0;
                unsigned long long fired = 0, fired_union = 0;
                for (int b = 0; b < B; b++) { mean_active += (double)active[b] / B; fired += active[b]; }
                for (char a : any) { fired_union += a; }
                auto error = [&](const char* path) {
                    std::vector<float> y = to_float(download(y_d, (size_t)B * D));
                    double e = 0;
                    if (pt[0] == 0.0) { // nothing fires: y must be exactly 0
                        for (float v : y) { if (v != 0.0f) { e = INFINITY; } }
                    } else {
                        e = max_rel_err(y.data(), ref.data(), ref.size());
                    }
                    CHECK(e < 1e-2, "sparse decode FFN (%s) B %d p %g: rel err %g", path, B, pt[0], e);
                    printf("  sparse decode FFN %-12s B %2d, %5.1f of %d units active: rel err %.2e\n", path, B, mean_active,
                           H, e);
                };
                // g given (cuBLASLt's in the model), up lists g > 0, down
                cudaCheck(cudaMemset(y_d, 0xFF, (size_t)B * D * sizeof(bf16)));
                cudaCheck(cudaMemset(count_d, 0xFF, B * sizeof(int)));
                cudaCheck(cudaMemset(a_d, 0xFF, (size_t)B * H * sizeof(float)));
                cudaCheck(cudaMemset(fired_d, 0, 2 * sizeof(unsigned long long)));
                sparse_up_kernel<<<dim3(SPARSE_UP_BLOCKS, B), SPARSE_THREADS, H * sizeof(int)>>>(a_d, list_d, count_d, g_d,
                                                                                                 f_d, wu_d, D, H, fired_d);
                cudaCheck(cudaGetLastError());
                fired_union_kernel<<<ceil_div(H, SPARSE_THREADS), SPARSE_THREADS>>>(fired_d + 1, g_d, B, H);
                cudaCheck(cudaGetLastError());
                std::vector<unsigned long long> counted = download(fired_d, 2);
                CHECK(counted[0] == fired, "sparse up B %d p %g: counted %llu fired units, not %llu", B, pt[0], counted[0],
                      fired);
                CHECK(counted[1] == fired_union, "fired_union_kernel B %d p %g: counted %llu units fired in some row, not %llu",
                      B, pt[0], counted[1], fired_union);
                sparse_down_kernel<<<down_grid, SPARSE_THREADS, sparse_down_smem(H)>>>(y_d, a_d, list_d, count_d, wdT_d, D, H);
                cudaCheck(cudaGetLastError());
                CHECK(download(count_d, B) == active, "sparse decode B %d p %g: active counts differ from g's", B, pt[0]);
                error("(list)");
                if (early_launch_supported() && sparse_up_down_fits(H)) { // up and down in a cluster per row: the list path's bits
                    const std::vector<bf16> y_list = download(y_d, (size_t)B * D);
                    cudaCheck(cudaMemset(y_d, 0xFF, (size_t)B * D * sizeof(bf16)));
                    cudaCheck(cudaMemset(fired_d, 0, sizeof(unsigned long long)));
                    launch_early_clusters(UP_DOWN_CLUSTER, sparse_up_down_kernel, dim3(UP_DOWN_CLUSTER, B), SPARSE_THREADS,
                                          sparse_up_down_smem(H), y_d, (const bf16*)g_d, (const bf16*)f_d,
                                          (const bf16*)wu_d, (const bf16*)wdT_d, D, H, fired_d);
                    cudaCheck(cudaGetLastError());
                    const std::vector<bf16> y_cluster = download(y_d, (size_t)B * D);
                    CHECK(memcmp(y_cluster.data(), y_list.data(), y_list.size() * sizeof(bf16)) == 0,
                          "sparse up + down in clusters B %d D %d p %g: y differs from the list path's bits", B, D, pt[0]);
                    CHECK(download(fired_d, 1)[0] == fired, "sparse up + down in clusters B %d p %g: counted %llu fired units, not %llu",
                          B, pt[0], download(fired_d, 1)[0], fired);
                    error("(clusters)");
                }
                if (B <= GEMV_MAX_ROWS) { // the fused gate + up (every a written), then down from a != 0
                    cudaCheck(cudaMemset(y_d, 0xFF, (size_t)B * D * sizeof(bf16)));
                    cudaCheck(cudaMemset(a_d, 0xFF, (size_t)B * H * sizeof(float)));
                    cudaCheck(cudaMemset(fired_d, 0, 2 * sizeof(unsigned long long)));
                    gemv(GateUpRow{a_d, wu_d, D, H, fired_d, fired_d + 1}, f_d, wg_d, B, H, D);
                    cudaCheck(cudaGetLastError());
                    counted = download(fired_d, 2);
                    CHECK(counted[0] == fired, "gate + up B %d p %g: counted %llu fired units, not %llu", B, pt[0],
                          counted[0], fired);
                    CHECK(counted[1] == fired_union, "gate + up B %d p %g: counted %llu units fired in some row, not %llu",
                          B, pt[0], counted[1], fired_union);
                    sparse_down_active_kernel<<<down_grid, SPARSE_THREADS, sparse_down_smem(H)>>>(y_d, a_d, wdT_d, D, H);
                    cudaCheck(cudaGetLastError());
                    error("(fused gate)");
                }
                cuda_free(f_d); cuda_free(wg_d); cuda_free(wu_d); cuda_free(wdT_d); cuda_free(g_d); cuda_free(y_d);
                cuda_free(list_d); cuda_free(count_d); cuda_free(a_d); cuda_free(fired_d);
            }
        }
    }
}

// the CPU reference's logits of a script: prefill of the prompts, then steps
// of one token per sequence; [call][sequence][Vp]
struct Script {
    std::vector<int> tokens, lens;           // prompts, concatenated
    std::vector<std::vector<int>> next;      // [step][sequence] token fed
    std::vector<std::vector<double>> logits; // [call] [nseq * Vp]
};

static Script cpu_script(const GPTConfig* c, const std::vector<float>& params, int steps, uint64_t* rng) {
    Script s;
    s.lens = {5, 17, 17, 1}; // the two of 17 are one batch of the prefill's attention
    int nseq = (int)s.lens.size(), Vp = c->padded_vocab_size, total = 0;
    for (int l : s.lens) {
        for (int t = 0; t < l; t++) { s.tokens.push_back((int)rng_below(rng, c->vocab_size)); }
        total += l;
    }
    GPT<float, float> model;
    gpt_build(&model, c, DEVICE_CPU);
    gpt_load_params(&model, params.data());
    InferState<float> state;
    infer_state_alloc(&state, &model, nseq, total, c->max_seq_len);
    std::vector<float> logits((size_t)nseq * Vp);
    gpt_prefill(&model, &state, s.tokens.data(), s.lens.data(), nseq, logits.data());
    s.logits.push_back(std::vector<double>(logits.begin(), logits.end()));
    for (int step = 0; step < steps; step++) {
        std::vector<int> next(nseq), pos(nseq);
        for (int i = 0; i < nseq; i++) { next[i] = (int)rng_below(rng, c->vocab_size); pos[i] = s.lens[i] + step; }
        gpt_decode(&model, &state, next.data(), pos.data(), nseq, logits.data());
        s.logits.push_back(std::vector<double>(logits.begin(), logits.end()));
        s.next.push_back(next);
    }
    infer_state_free(&state, &model);
    gpt_free(&model);
    return s;
}

// runs the script on the GPU; returns the worst relative error of any call's
// logits (NaN: infinite) and leaves every call's logits in out
static double gpu_script(GPT<bf16, float>* model, InferState<bf16>* m, const Script& s,
                         std::vector<std::vector<float>>* out) {
    int nseq = (int)s.lens.size(), Vp = model->config.padded_vocab_size;
    double worst = 0;
    out->clear();
    for (size_t call = 0; call < s.logits.size(); call++) {
        std::vector<float> logits((size_t)nseq * Vp, NAN);
        cudaCheck(cudaMemsetAsync(m->logits, 0xFF, (size_t)nseq * Vp * sizeof(bf16), main_stream));
        if (call == 0) {
            gpt_prefill(model, m, s.tokens.data(), s.lens.data(), nseq, logits.data());
        } else {
            std::vector<int> pos(nseq);
            for (int i = 0; i < nseq; i++) { pos[i] = s.lens[i] + (int)call - 1; }
            gpt_decode(model, m, s.next[call - 1].data(), pos.data(), nseq, logits.data());
        }
        // only the real vocabulary: the padded rows of wte are 0 on both sides
        for (int i = 0; i < nseq; i++) {
            double e = max_rel_err(logits.data() + (size_t)i * Vp, s.logits[call].data() + (size_t)i * Vp,
                                   model->config.vocab_size);
            worst = fmax(worst, e);
        }
        out->push_back(logits);
    }
    return worst;
}

static void test_model(const char* name, bool synthetic) {
    GPTConfig c = {300, 384, 2, 128, 4, 2, 512, 64, 10000.0f, 1e-5f, ACT_RELU, 0};
    const int steps = 4;
    uint64_t rng = synthetic ? 404 : 303;
    GPT<bf16, float> model;
    InferState<bf16> m;
    gpt_build(&model, &c, DEVICE_CUDA);
    infer_state_alloc(&m, &model, 4, 64, c.max_seq_len);
    m.ffn.twell.min_rows = 0; // TwELL prefills of any size (the default runs a few rows dense)
    std::vector<float> params(num_parameters(&c));
    if (synthetic) { // the GPU's synthetic-sparse init, calibrated by one prefill, then read back
        init_params_synthetic_gpu(&model, 7, 8.0);
        std::vector<int> tokens(40), lens = {40};
        for (int& t : tokens) { t = (int)rng_below(&rng, c.vocab_size); }
        synthetic_calibrate(&model, &m, tokens.data(), lens.data(), 1, 8.0, 1, 5); // skewed rates
        params = to_float(download(model.params, params.size()));
    } else {
        init_params_random(params.data(), &c, 42);
        for (float& p : params) { p = __bfloat162float(__float2bfloat16(p)); }
        gpt_load_params(&model, params.data());
    }
    Script s = cpu_script(&c, params, steps, &rng);
    std::vector<std::vector<float>> dense, sparse, direct;

    model.ffn.mode = FFN_DENSE;
    double e = gpu_script(&model, &m, s, &dense);
    CHECK(e < 3e-2, "%s: dense GPU logits vs CPU rel err %g", name, e);
    printf("  %s, dense:  prefill + %d decode steps, logits rel err %.2e\n", name, steps, e);

    model.ffn.mode = FFN_SPARSE;
    m.ffn.twell.choice = TWELL_FORCE_SPARSE;
    e = gpu_script(&model, &m, s, &sparse);
    CHECK(e < 3e-2, "%s: TwELL GPU logits vs CPU rel err %g", name, e);
    twell_prefill_settle(&m.ffn.twell);
    int all_sparse = 1;
    for (int l = 0; l < c.num_layers; l++) { all_sparse &= m.ffn.twell.path[l] == TWELL_SPARSE; }
    CHECK(all_sparse, "%s: a TwELL prefill layer took the dense path", name);
    double active = 0;
    for (int l = 0; l < c.num_layers; l++) { active += m.ffn.twell.layer_active[l] / c.num_layers; }
    printf("  %s, TwELL:  prefill + %d decode steps, logits rel err %.2e (%.1f of %d units active per row)\n", name,
           steps, e, active, c.hidden);
    // the calibration aims at the mean ratio of a layer's rows; spread over rows raises the activity (dev/NOTES.md)
    if (synthetic) { CHECK(active > 2 && active < 0.1 * c.hidden, "%s: %.1f active units per row, aimed at 8", name, active); }
    else { CHECK(active > 128, "%s: %.1f active units per row: the tiles were meant to overflow", name, active); }

    m.dev.use_graph = 0; // the same steps launched directly: the same bits
    gpu_script(&model, &m, s, &direct);
    CHECK(direct == sparse, "%s: decode as a graph and launched directly differ", name);
    m.dev.use_graph = 1;

    // blocks of one slot: every tile with more than one active unit takes its overflow record (on the
    // device, in the same pass), the logits are exact
    auto records = [&] {
        twell_prefill_settle(&m.ffn.twell);
        long long n = 0;
        for (int l = 0; l < c.num_layers; l++) { n += twell_prefill_records(&m.ffn.twell, l); }
        return n;
    };
    m.ffn.twell.slots = 1;
    e = gpu_script(&model, &m, s, &direct);
    long long taken = records();
    CHECK(taken > 0 && e < 3e-2, "%s: TwELL with 1 slot a block: %lld records, rel err %g", name, taken, e);
    printf("  %s, TwELL with 1 slot a block: %lld overflow records, rel err %.2e\n", name, taken, e);
    m.ffn.twell.slots = 0;

    m.ffn.twell.ffn.choice = TWELL_AUTO; // auto: either path, the same logits within tolerance
    for (int i = 0; i < 2; i++) { e = gpu_script(&model, &m, s, &direct); }
    CHECK(e < 3e-2, "%s: TwELL auto (%s path at layer 0) rel err %g", name,
          m.ffn.twell.path[0] == TWELL_DENSE ? "dense" : "sparse", e);

    // hot units (llmc/ffn/split.h): the first 64 units of every layer dense, TwELL over the rest (any units may be
    // hot: the split is exact whichever they are), then the hot sets a calibration prefill chooses (which
    // reorders the units: the same function)
    m.ffn.twell.ffn.choice = TWELL_FORCE_SPARSE;
    for (int l = 0; l < c.num_layers; l++) { model.ffn.layer[l].hot_units = 64; }
    e = gpu_script(&model, &m, s, &direct);
    CHECK(e < 3e-2, "%s: TwELL with 64 hot units a layer: rel err %g", name, e);
    // and with 1 slot a block: the cold units' tiles overflow into their records
    m.ffn.twell.slots = 1;
    e = gpu_script(&model, &m, s, &direct);
    taken = records();
    CHECK(taken > 0 && e < 3e-2, "%s: TwELL with 64 hot units and 1 slot a block: %lld records, rel err %g", name,
          taken, e);
    m.ffn.twell.slots = 0;
    for (int l = 0; l < c.num_layers; l++) { model.ffn.layer[l].hot_units = 0; }
    std::vector<int> tokens(48), lens = {48};
    for (int& t : tokens) { t = (int)rng_below(&rng, c.vocab_size); }
    infer_hot_calibrate(&model, &m, tokens.data(), lens.data(), 1, 0);
    e = gpu_script(&model, &m, s, &direct);
    int hot = 0;
    for (int l = 0; l < c.num_layers; l++) { hot += model.ffn.layer[l].hot_units; }
    CHECK(e < 3e-2, "%s: TwELL after the hot-unit calibration (%d hot units in all): rel err %g", name, hot, e);
    printf("  %s, TwELL with hot units: 64 a layer and as calibrated (%d in all), rel err %.2e\n", name, hot, e);
    infer_state_free(&m, &model);
    gpt_free(&model);
}

// a SiLU model with an untied head: the dense FFN (the only one SiLU runs), logits from lm_head
static void test_model_silu(void) {
    GPTConfig c = {300, 384, 2, 128, 4, 2, 512, 64, 10000.0f, 1e-5f, ACT_SILU, 1};
    uint64_t rng = 505;
    GPT<bf16, float> model;
    InferState<bf16> m;
    gpt_build(&model, &c, DEVICE_CUDA);
    infer_state_alloc(&m, &model, 4, 64, c.max_seq_len);
    std::vector<float> params(num_parameters(&c));
    init_params_random(params.data(), &c, 43);
    for (float& p : params) { p = __bfloat162float(__float2bfloat16(p)); }
    gpt_load_params(&model, params.data());
    Script s = cpu_script(&c, params, 4, &rng);
    std::vector<std::vector<float>> out, direct;
    model.ffn.mode = FFN_DENSE;
    double e = gpu_script(&model, &m, s, &out);
    CHECK(e < 3e-2, "SiLU, untied head: dense GPU logits vs CPU rel err %g", e);
    printf("  SiLU, untied head, dense: prefill + 4 decode steps, logits rel err %.2e\n", e);
    m.dev.use_graph = 0;
    gpu_script(&model, &m, s, &direct);
    CHECK(direct == out, "SiLU, untied head: decode as a graph and launched directly differ");
    infer_state_free(&m, &model);
    gpt_free(&model);
}

// Continuous batching as the server runs it: sequences in slots 3, 0 and 2 of
// 4, prompts prefilled in chunks (two sequences' chunks in one call), decode
// batches of 2 and 3 rows in any slot order, a sequence leaving; every call's
// logits against the CPU path doing the same, FFN dense and sparse; the decode
// steps as graphs (one per batch size) and launched directly, the same bits;
// the FFN's fired units counted on the GPU (relu_mul for dense, the sparse
// decode's gate for sparse) against the CPU's count of the same steps; each
// decode row's greedy token (the GPU's greedy_kernel on the CUDA path) equal
// to logits_greedy of the logits it came with.
struct SlotOp {
    bool decode;
    std::vector<int> slot, start, len, tokens; // prefill: chunks; decode: start = position, len 1
};

template <typename T, typename G>
static std::vector<std::vector<float>> run_slot_ops(GPT<T, G>* model, InferState<T>* s, const std::vector<SlotOp>& ops,
                                                    std::vector<uint64_t>* fired,
                                                    std::vector<uint64_t>* fired_union = NULL) {
    std::vector<std::vector<float>> out;
    const int Vp = model->config.padded_vocab_size;
    for (const SlotOp& op : ops) {
        int n = (int)op.slot.size();
        std::vector<float> logits((size_t)n * Vp, NAN);
        if (op.decode) {
            std::vector<int> best(n, -7);
            gpt_decode_slots(model, s, op.tokens.data(), op.start.data(), op.slot.data(), n, logits.data(), best.data());
            for (int b = 0; b < n; b++) {
                int want = logits_greedy(logits.data() + (size_t)b * Vp, model->config.vocab_size);
                CHECK(best[b] == want, "decode row %d of %d: greedy token %d, the logits' greedy token is %d", b, n,
                      best[b], want);
            }
        } else {
            gpt_prefill_chunks(model, s, op.tokens.data(), op.len.data(), op.slot.data(), op.start.data(), n, logits.data());
        }
        out.push_back(logits);
    }
    fired->assign(model->config.num_layers, 0);
    if (fired_union) { fired_union->assign(model->config.num_layers, 0); }
    gpt_fired_read(model, s, fired->data(), fired_union ? fired_union->data() : NULL);
    return out;
}

static void test_model_slots(void) {
    GPTConfig c = {300, 384, 2, 128, 4, 2, 512, 64, 10000.0f, 1e-5f, ACT_RELU, 0};
    uint64_t rng = 606;
    std::vector<float> params(num_parameters(&c));
    init_params_random(params.data(), &c, 44);
    for (float& p : params) { p = __bfloat162float(__float2bfloat16(p)); }
    auto tokens = [&](int n) {
        std::vector<int> t(n);
        for (int& x : t) { x = (int)rng_below(&rng, c.vocab_size); }
        return t;
    };
    auto prefill = [&](std::vector<int> slot, std::vector<int> start, std::vector<int> len) {
        SlotOp op = {false, slot, start, len, {}};
        for (int l : len) { std::vector<int> t = tokens(l); op.tokens.insert(op.tokens.end(), t.begin(), t.end()); }
        return op;
    };
    auto decode = [&](std::vector<int> slot, std::vector<int> pos) {
        return SlotOp{true, slot, pos, std::vector<int>(slot.size(), 1), tokens((int)slot.size())};
    };
    // A (slot 3): 30 prompt tokens; B (slot 0): 5; C (slot 2): 20
    std::vector<SlotOp> ops = {prefill({3, 0}, {0, 0}, {16, 5}), prefill({3, 2}, {16, 0}, {14, 10}),
                               decode({0, 3}, {5, 30}), prefill({2}, {10}, {10}), decode({2, 3, 0}, {20, 31, 6}),
                               decode({3, 2}, {32, 21}), decode({3, 2}, {33, 22}), decode({2, 0, 3}, {23, 7, 34})};
    GPT<float, float> cpu;
    gpt_build(&cpu, &c, DEVICE_CPU);
    gpt_load_params(&cpu, params.data());
    InferState<float> cs;
    infer_state_alloc(&cs, &cpu, 4, 24, c.max_seq_len);
    infer_state_count_fired(&cs, &cpu);
    std::vector<uint64_t> cpu_fired, gpu_fired;
    std::vector<std::vector<float>> ref = run_slot_ops(&cpu, &cs, ops, &cpu_fired);
    GPT<bf16, float> model;
    gpt_build(&model, &c, DEVICE_CUDA);
    gpt_load_params(&model, params.data());
    for (int mode : {FFN_DENSE, FFN_SPARSE}) {
        InferState<bf16> m;
        infer_state_alloc(&m, &model, 4, 24, c.max_seq_len);
        infer_state_count_fired(&m, &model, 1);
        model.ffn.mode = mode;
        const char* name = mode == FFN_DENSE ? "dense" : "sparse";
        std::vector<uint64_t> gpu_union;
        std::vector<std::vector<float>> got = run_slot_ops(&model, &m, ops, &gpu_fired, &gpu_union);
        double worst = 0;
        for (size_t k = 0; k < ops.size(); k++) {
            for (size_t i = 0; i < ops[k].slot.size(); i++) {
                const float* a = got[k].data() + i * c.padded_vocab_size;
                std::vector<double> b(ref[k].begin() + i * c.padded_vocab_size, ref[k].begin() + (i + 1) * c.padded_vocab_size);
                worst = fmax(worst, max_rel_err(a, b.data(), c.vocab_size));
            }
        }
        CHECK(worst < 3e-2, "slots, chunks, %s FFN: GPU logits vs CPU rel err %g", name, worst);
        double fired_err = 0;
        for (int l = 0; l < c.num_layers; l++) {
            fired_err = fmax(fired_err, fabs((double)gpu_fired[l] - cpu_fired[l]) / fmax((double)cpu_fired[l], 1.0));
        }
        CHECK(cpu_fired[0] > 0 && fired_err < 0.05, "slots, %s FFN: fired units counted on the GPU differ from the "
              "CPU's by %.1f%% (layer 0: %llu vs %llu)", name, 100 * fired_err, (unsigned long long)gpu_fired[0],
              (unsigned long long)cpu_fired[0]);
        // the union of a step's units: counted by the sparse decode only; between a step's pairs / rows and its pairs
        bool union_ok = true;
        for (int l = 0; l < c.num_layers; l++) {
            union_ok = union_ok && (mode == FFN_DENSE ? gpu_union[l] == 0
                                                      : gpu_union[l] <= gpu_fired[l] && 3 * gpu_union[l] >= gpu_fired[l]);
        }
        CHECK(union_ok, "slots, %s FFN: units fired in some row of a step, layer 0: %llu of %llu fired (at most 3 rows "
              "a step)", name, (unsigned long long)gpu_union[0], (unsigned long long)gpu_fired[0]);
        infer_state_free(&m, &model);
        infer_state_alloc(&m, &model, 4, 24, c.max_seq_len);
        infer_state_count_fired(&m, &model);
        m.dev.use_graph = 0;
        std::vector<std::vector<float>> direct = run_slot_ops(&model, &m, ops, &gpu_fired);
        bool same = true;
        for (size_t k = 0; k < ops.size(); k++) {
            same &= memcmp(direct[k].data(), got[k].data(), got[k].size() * sizeof(float)) == 0;
        }
        CHECK(same, "slots, %s FFN: decode graphs per batch size and direct launches differ", name);
        printf("  slots 3/0/2 of 4, chunked prefills, decode batches of 2 and 3, %s FFN: logits rel err %.2e, fired "
               "units within %.1f%% of the CPU's count\n", name, worst, 100 * fired_err);
        infer_state_free(&m, &model);
    }
    infer_state_free(&cs, &cpu);
    gpt_free(&cpu);
    gpt_free(&model);
}

int main(void) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("test_infer on %s\n", prop.name);
    test_decode_attention(300);
    test_decode_attention(1100);
    test_decode_attention(2048);
    test_prefill_rope_cache();
    test_chunk_attention();
    test_decode_linear();
    test_sparse_decode_ffn();
    test_model("random weights", false);
    test_model("synthetic-sparse", true);
    test_model_silu();
    test_model_slots();
    return test_summary("test_infer");
}
