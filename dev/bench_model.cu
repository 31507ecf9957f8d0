/*
 Model-level GPU benchmark: training step and prefill throughput of a preset
 shape on random tokens, with MFU against this GPU's measured bf16 GEMM rate
 and peak device memory. Compare with dev/bench_pytorch.py on the same GPU.
 The FFN is dense, ReLU or SiLU (a dense Llama's; to compare the two, run them
 in turn on one machine).

 usage: build/dev/bench_model PRESET B T [steps] [relu|silu]    e.g. 1.5b 4 2048 10
*/
#include "llmc/optimizer.h"
#include "test/gpu/gpu_util.cuh"

int main(int argc, char** argv) {
    if (argc < 4) { fatal("usage: %s PRESET B T [steps] [relu|silu]", argv[0]); }
    const ModelPreset* shape = find_preset(argv[1]);
    if (shape == NULL) { fatal("unknown preset %s", argv[1]); }
    int B = atoi(argv[2]), T = atoi(argv[3]), steps = argc > 4 ? atoi(argv[4]) : 10, M = B * T;
    int activation = argc > 5 ? find_activation(argv[5]) : ACT_RELU;
    if (activation < 0) { fatal("activation %s: relu or silu", argv[5]); }
    GPTConfig c = {50257, 50304, shape->layers, shape->dim, shape->heads, shape->heads, shape->hidden, T, 10000.0f, 1e-5f,
                   activation, 0};
    double peak = measure_peak_bf16_flops();

    GPT<bf16, float> model;
    gpt_build(&model, &c, DEVICE_CUDA);
    model.logits_bytes = SIZE_MAX; // every row's logits at once, as dev/bench_pytorch.py holds them (its prefill keeps them)
    Optimizer opt;
    optimizer_init(&opt, &model, NULL);
    float* host = (float*)mallocCheck(model.num_parameters * sizeof(float));
    init_params_random(host, &c, 1);
    set_params_from_fp32(&model, &opt, host);
    free(host);
    TokenBatch batch = upload_random_batch(M, c.vocab_size, 3);
    const int *d_in = batch.inputs, *d_tg = batch.targets;
    OptimConfig oc = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0, 1000, 0.1f};

    // prefill: the forward with its logits, no loss, no backward
    double t_prefill = 0;
    for (int i = 0; i < steps + 2; i++) {
        cudaCheck(cudaDeviceSynchronize());
        double t0 = now_seconds();
        gpt_forward(&model, d_in, (const int*)NULL, B, T, 0.0f);
        cudaCheck(cudaDeviceSynchronize());
        if (i >= 2) { t_prefill += now_seconds() - t0; }
    }
    double t_train = 0;
    for (int i = 0; i < steps + 2; i++) {
        double t0 = now_seconds();
        gpt_zero_grad(&model);
        gpt_stats_reset(&model);
        gpt_forward(&model, d_in, d_tg, B, T, 1.0f / M);
        gpt_backward(&model, d_in, activation == ACT_RELU ? 2e-5f / (c.num_layers * M) : 0.0f);
        optimizer_step(&opt, &model, &oc, 1e-4f, i + 1);
        gpt_stats_read(&model, M);
        if (i >= 2) { t_train += now_seconds() - t0; }
    }
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    double train_tps = (double)M * steps / t_train, prefill_tps = (double)M * steps / t_prefill;
    double mfu = train_tps * training_flops_per_token(&c, T) / peak;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("ours %s %s B%d T%d (%.0fM params, %s): train %.0f tok/s, MFU %.1f%% of %.0f TFLOP/s | prefill %.0f tok/s | "
           "device memory in use %.1f GiB | loss %.4f\n", argv[1], activation_names[activation], B, T, model.num_parameters / 1e6, prop.name, train_tps,
           100 * mfu, peak / 1e12, prefill_tps, (total_b - free_b) / 1073741824.0, model.ce);
    optimizer_free(&opt);
    gpt_free(&model);
    cublaslt_free();
    return 0;
}
