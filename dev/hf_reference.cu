/*
 Writes what dev/compare_hf.py checks against Hugging Face's LlamaForCausalLM
 (hidden_act="relu"): a random model as a checkpoint, a batch, and our CPU
 (fp32) and GPU (bf16) paths' outputs on it: loss, L1 term, logits and every
 parameter gradient.

 usage: build/dev/hf_reference OUT_DIR [lambda]
 writes OUT_DIR/model.bin (our checkpoint) and OUT_DIR/outputs.bin:
   int32 B, T, V, Vp; float lambda; int32 tokens[B*T], targets[B*T];
   then for the CPU path and then the GPU path: float ce, l1_term,
   logits[B*T, Vp] (before the loss), grads[num_parameters] (flat layout).
*/
#include "llmc/checkpoint.h"
#include "llmc/gpt.h"

static void write_path_outputs(FILE* fp, double ce, double l1, const float* logits, const float* grads, size_t M,
                               const GPTConfig* c) {
    float ce_f = (float)ce, l1_f = (float)l1;
    fwriteCheck(&ce_f, sizeof(float), 1, fp);
    fwriteCheck(&l1_f, sizeof(float), 1, fp);
    fwriteCheck(logits, sizeof(float), M * c->padded_vocab_size, fp);
    fwriteCheck(grads, sizeof(float), num_parameters(c), fp);
}

int main(int argc, char** argv) {
    if (argc < 2) { fatal("usage: %s OUT_DIR [lambda]", argv[0]); }
    float lambda = argc > 2 ? (float)atof(argv[2]) : 0.01f;
    // a small GQA config with the head size of the paper's shapes
    GPTConfig c = {1000, 1024, 2, 256, 4, 2, 512, 128, 10000.0f, 1e-5f, ACT_RELU, 0};
    int B = 2, T = 128, M = B * T;
    size_t n = num_parameters(&c), logits_n = (size_t)M * c.padded_vocab_size;
    float* params = (float*)mallocCheck(n * sizeof(float));
    init_params_random(params, &c, 7);
    // bf16-exact, so that both paths see the same weights
    for (size_t i = 0; i < n; i++) { params[i] = __bfloat162float(__float2bfloat16(params[i])); }
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.bin", argv[1]);
    checkpoint_save_model(path, &c, params, 0);

    int* tokens = (int*)mallocCheck(M * sizeof(int));
    int* targets = (int*)mallocCheck(M * sizeof(int));
    uint64_t rng = 99;
    for (int i = 0; i < M; i++) { tokens[i] = (int)rng_below(&rng, c.vocab_size); }
    for (int i = 0; i < M; i++) { targets[i] = i % T == T - 1 ? (int)rng_below(&rng, c.vocab_size) : tokens[i + 1]; }
    float dloss = 1.0f / M, l1_scale = lambda / (c.num_layers * M);

    snprintf(path, sizeof(path), "%s/outputs.bin", argv[1]);
    FILE* fp = fopenCheck(path, "wb");
    int32_t dims[4] = {B, T, c.vocab_size, c.padded_vocab_size};
    fwriteCheck(dims, sizeof(int32_t), 4, fp);
    fwriteCheck(&lambda, sizeof(float), 1, fp);
    fwriteCheck(tokens, sizeof(int), M, fp);
    fwriteCheck(targets, sizeof(int), M, fp);

    // the logits are taken from a forward without targets: with them the buffer becomes dlogits
    float* logits = (float*)mallocCheck(logits_n * sizeof(float));
    GPT<float, float> cpu;
    gpt_build(&cpu, &c, DEVICE_CPU);
    memcpy(cpu.params, params, n * sizeof(float));
    gpt_forward(&cpu, tokens, (const int*)NULL, B, T, 0.0f);
    memcpy(logits, cpu.acts.logits, logits_n * sizeof(float));
    gpt_zero_grad(&cpu);
    gpt_stats_reset(&cpu);
    gpt_forward(&cpu, tokens, targets, B, T, dloss);
    gpt_backward(&cpu, tokens, l1_scale);
    gpt_stats_read(&cpu, M);
    write_path_outputs(fp, cpu.ce, cpu.l1_term, logits, cpu.grads, M, &c);

    GPT<bf16, float> gpu;
    gpt_build(&gpu, &c, DEVICE_CUDA);
    bf16* hp = (bf16*)mallocCheck(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) { hp[i] = __float2bfloat16(params[i]); }
    cudaCheck(cudaMemcpy(gpu.params, hp, n * sizeof(bf16), cudaMemcpyHostToDevice));
    int* d_tokens = (int*)cuda_malloc(M * sizeof(int));
    int* d_targets = (int*)cuda_malloc(M * sizeof(int));
    cudaCheck(cudaMemcpy(d_tokens, tokens, M * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_targets, targets, M * sizeof(int), cudaMemcpyHostToDevice));
    gpt_forward(&gpu, d_tokens, (const int*)NULL, B, T, 0.0f);
    bf16* hl = (bf16*)mallocCheck(logits_n * sizeof(bf16));
    cudaCheck(cudaMemcpy(hl, gpu.acts.logits, logits_n * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < logits_n; i++) { logits[i] = __bfloat162float(hl[i]); }
    gpt_zero_grad(&gpu);
    gpt_stats_reset(&gpu);
    gpt_forward(&gpu, d_tokens, d_targets, B, T, dloss);
    gpt_backward(&gpu, d_tokens, l1_scale);
    gpt_stats_read(&gpu, M);
    float* grads = (float*)mallocCheck(n * sizeof(float));
    cudaCheck(cudaMemcpy(grads, gpu.grads, n * sizeof(float), cudaMemcpyDeviceToHost));
    write_path_outputs(fp, gpu.ce, gpu.l1_term, logits, grads, M, &c);
    fcloseCheck(fp);
    printf("wrote %s/model.bin and %s/outputs.bin: cpu loss %.6f, gpu loss %.6f\n", argv[1], argv[1], cpu.ce, gpu.ce);

    gpt_free(&cpu);
    gpt_free(&gpu);
    cublaslt_free();
    cuda_free(d_tokens); cuda_free(d_targets);
    free(params); free(tokens); free(targets); free(logits); free(hp); free(hl); free(grads);
    return 0;
}
