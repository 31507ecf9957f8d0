/*
 The "trained" pattern of the FFN benchmarks (docs/SPARSE.md, benchmark
 conventions): one layer of a checkpoint trained by this project (e.g. by
 dev/train_pattern_model.sh) on its real inputs. The model runs a forward over
 the first M tokens of the corpus's validation shards (sequences of up to 1024
 tokens); f is layer l's FFN input there, and the weights are the layer's.
*/
#ifndef DEV_TRAINED_LAYER_CUH
#define DEV_TRAINED_LAYER_CUH

#include <algorithm>
#include <vector>
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/gpt.h"
#include "test/gpu/gpu_util.cuh"

// f [M, D] and Wg, Wu, WdT [H, D] (device) of layer l of the checkpoint at path
static void load_trained_layer(const char* path, int l, int M, int D, int H, bf16* f, bf16* wg, bf16* wu, bf16* wdT) {
    GPTConfig c;
    float* params = checkpoint_load_model(path, &c, NULL);
    if (c.channels != D || c.hidden != H) {
        fatal("%s: D %d, H %d; the benchmark runs D %d, H %d", path, c.channels, c.hidden, D, H);
    }
    if (l < 0 || l >= c.num_layers) { fatal("layer %d: %s has layers 0..%d", l, path, c.num_layers - 1); }
    int T = std::min(1024, c.max_seq_len), B = M / T;
    if (B * T != M) { fatal("M %d is not a multiple of the sequence length %d", M, T); }
    GPT<bf16, float> model;
    gpt_build(&model, &c, DEVICE_CUDA);
    model.ffn.mode = FFN_DENSE;
    model.logits_bytes = SIZE_MAX; // (a forward without targets keeps every row's logits)
    gpt_load_params(&model, params);
    free(params);
    DataLoader val;
    dataloader_init(&val, "data/corpus_val_*.bin", B, T, 0, 1, 0, 0, c.vocab_size);
    dataloader_next_batch(&val);
    int* tokens = upload(std::vector<int>(val.inputs, val.inputs + M));
    gpt_forward(&model, tokens, (const int*)NULL, B, T, 0.0f);
    size_t MD = (size_t)M * D, HD = (size_t)H * D;
    // (the forward keeps the last layer's FFN input only)
    cudaCheck(cudaMemcpy(f, gpt_norm_output(&model, l, 1), MD * 2, cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(wg, model.param[P_WG] + l * HD, HD * 2, cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(wu, model.param[P_WU] + l * HD, HD * 2, cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(wdT, model.param[P_WDT] + l * HD, HD * 2, cudaMemcpyDeviceToDevice));
    cuda_free(tokens);
    dataloader_free(&val);
    gpt_free(&model);
}

#endif // DEV_TRAINED_LAYER_CUH
