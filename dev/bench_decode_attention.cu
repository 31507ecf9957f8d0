/*
 Times the decode attention (attention_decode, llmc/cuda_attention_cached.cuh)
 alone: B sequences, each at position `context` - 1 of its cache (so it reads
 context - 1 cached keys and values and turns and writes the new one), 32
 heads of 64 (the 1.5B shape) and 16 heads of 128, NKV = NH. The bytes a call
 must read are the cached keys and values, B (context - 1) NKV hd 2 x 2; the
 share of the GPU's bandwidth is that over the streaming read measured in the
 same run. The kernel is launched for the context's class
 (attention_decode_context); with a longer cache (a server's is its model's
 max_seq_len) a second line launches it for the whole cache, as a step did
 before the classes, timed side by side (median of `reps` rounds), with
 whether its output has the same bits.
 usage: build/dev/bench_decode_attention [B (16)] [context (1024)] [reps (50)] [cache_len (context)]
*/
#include <vector>
#include "llmc/cuda_attention_cached.cuh"
#include "test/gpu/gpu_util.cuh"

int main(int argc, char** argv) {
    const int B = argc > 1 ? atoi(argv[1]) : 16, context = argc > 2 ? atoi(argv[2]) : 1024;
    const int reps = argc > 3 ? atoi(argv[3]) : 50, cache_len = argc > 4 ? atoi(argv[4]) : context;
    if (B < 1 || context < 1 || reps < 1 || cache_len < context) {
        fatal("usage: bench_decode_attention [B >= 1] [context >= 1] [reps >= 1] [cache_len >= context]");
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const double bandwidth = measure_read_bandwidth();
    const int bound = attention_decode_context(attention_decode_class(context), cache_len);
    printf("%s: decode attention, B %d, context %d (launched for %d) of a cache of %d; streaming read %.2f TB/s\n",
           prop.name, B, context, bound, cache_len, bandwidth / 1e12);
    for (int hd : {64, 128}) {
        const int NH = 2048 / hd, NKV = NH, QKV = (NH + 2 * NKV) * hd;
        uint64_t rng = 7;
        std::vector<bf16> qkv((size_t)B * QKV), cache((size_t)B * cache_len * NKV * hd);
        for (auto& x : qkv) { x = __float2bfloat16((float)rng_normal(&rng)); }
        for (auto& x : cache) { x = __float2bfloat16((float)rng_normal(&rng)); }
        std::vector<int> slot(B), pos(B, context - 1);
        for (int b = 0; b < B; b++) { slot[b] = b; }
        bf16 *qkv_d = upload(qkv), *k_d = upload(cache), *v_d = upload(cache);
        int *slot_d = upload(slot), *pos_d = upload(pos);
        float *part_o, *part_ml;
        int* splits_done;
        attention_decode_alloc(&part_o, &part_ml, &splits_done, B, NH, hd, cache_len);
        std::vector<bf16*> outs;
        auto variant = [&](auto launch, int launched) { // launched for that many positions
            const int splits = attention_decode_splits(launched);
            const dim3 grid(NH, B, splits);
            bf16* out = (bf16*)cuda_malloc((size_t)B * NH * hd * sizeof(bf16));
            cudaCheck(cudaMemset(out, 0xFF, (size_t)B * NH * hd * sizeof(bf16)));
            outs.push_back(out);
            return std::function<void()>([=] {
                launch(grid, out, part_o, part_ml, splits_done, qkv_d, k_d, v_d, slot_d, pos_d, NH, NKV, cache_len,
                       splits, 10000.0f);
                cudaCheck(cudaGetLastError());
            });
        };
        auto launch = hd == 64 ? attention_detail::decode_attention_launch<64> : attention_detail::decode_attention_launch<128>;
        std::vector<std::function<void()>> fns = {variant(launch, bound)};
        if (bound < cache_len) { fns.push_back(variant(launch, cache_len)); }
        std::vector<float> ms = median_ms_interleaved(fns, reps, 2);
        const double bytes = 2.0 * B * (context - 1) * NKV * hd * sizeof(bf16);
        const std::vector<float> ref = to_float(download(outs[0], (size_t)B * NH * hd));
        for (size_t v = 0; v < fns.size(); v++) {
            const std::vector<float> o = to_float(download(outs[v], (size_t)B * NH * hd));
            double diff = 0;
            for (size_t i = 0; i < o.size(); i++) { diff = isnan(o[i]) ? INFINITY : fmax(diff, fabs(o[i] - ref[i])); }
            printf("  %2d heads of %3d, launched for %4d positions: %7.2f us, %6.1f MB, %.2f TB/s, %3.0f%% of the "
                   "bandwidth%s\n", NH, hd, v == 0 ? bound : cache_len, ms[v] * 1e3, bytes / 1e6,
                   bytes / (ms[v] * 1e-3) / 1e12, 100.0 * bytes / (ms[v] * 1e-3) / bandwidth,
                   v == 0 ? "" : diff == 0 ? "; the same bits" : "; DIFFERENT BITS");
            cuda_free(outs[v]);
        }
        cuda_free(qkv_d); cuda_free(k_d); cuda_free(v_d); cuda_free(slot_d); cuda_free(pos_d);
        cuda_free(part_o); cuda_free(part_ml); cuda_free(splits_done);
    }
    return 0;
}
