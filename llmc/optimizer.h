/*
 The optimizer state of a model and its step, for either backend: AdamW
 (llmc/adamw.h) with global-norm clipping, fp32 moments, and on the GPU fp32
 master weights from which the bf16 compute weights are rounded after every
 step. The moments (and master weights) are what checkpoints store, in fp32,
 so a checkpoint moves between the CPU and GPU paths.
*/
#ifndef LLMC_OPTIMIZER_H
#define LLMC_OPTIMIZER_H

#include "llmc/adamw.h"
#include "llmc/gpt.h"
#ifdef __CUDACC__
#include "llmc/cuda_adamw.cuh"
#endif

typedef struct {
    Device device;
    size_t n;
    float* master;      // GPU: fp32 master weights; CPU: NULL (the model's fp32 params are the master)
    float* m;           // first moments, on the model's device
    float* v;           // second moments
    float* norm_sq;     // GPU: the squared gradient norm of the last step, on the device
    float* scratch;     // GPU: the norm's partial sums
    double grad_norm;   // the last step's gradient norm (read with the step's statistics)
} Optimizer;

template <typename T, typename G>
void optimizer_init(Optimizer* opt, const GPT<T, G>* model) {
    memset(opt, 0, sizeof(*opt));
    opt->device = model->device;
    opt->n = model->num_parameters;
    opt->m = (float*)device_malloc(opt->n * sizeof(float), opt->device);
    opt->v = (float*)device_malloc(opt->n * sizeof(float), opt->device);
    device_zero(opt->m, opt->n * sizeof(float), opt->device);
    device_zero(opt->v, opt->n * sizeof(float), opt->device);
    if (opt->device == DEVICE_CUDA) {
        opt->master = (float*)device_malloc(opt->n * sizeof(float), opt->device);
        opt->norm_sq = (float*)device_malloc(sizeof(float), opt->device);
#ifdef __CUDACC__
        opt->scratch = (float*)device_malloc(GLOBAL_NORM_BLOCKS * sizeof(float), opt->device);
#endif
    }
}

static inline void optimizer_free(Optimizer* opt) {
    device_free(opt->m, opt->device);
    device_free(opt->v, opt->device);
    device_free(opt->master, opt->device);
    device_free(opt->norm_sq, opt->device);
    device_free(opt->scratch, opt->device);
    memset(opt, 0, sizeof(*opt));
}

// the model's parameters from / to fp32 host memory (checkpoints, initialisation)
static inline void set_params_from_fp32(GPT<float, float>* model, Optimizer* opt, const float* host) {
    memcpy(model->params, host, model->num_parameters * sizeof(float));
}

static inline void get_params_fp32(const GPT<float, float>* model, const Optimizer* opt, float* host) {
    memcpy(host, model->params, model->num_parameters * sizeof(float));
}

#ifdef __CUDACC__
static inline void set_params_from_fp32(GPT<bf16, float>* model, Optimizer* opt, const float* host) {
    device_copy(opt->master, host, opt->n * sizeof(float), DEVICE_CUDA);
    round_to_bf16_cuda(model->params, opt->master, opt->n);
}

static inline void get_params_fp32(const GPT<bf16, float>* model, const Optimizer* opt, float* host) {
    device_copy(host, opt->master, opt->n * sizeof(float), DEVICE_CUDA);
}
#endif

// one AdamW step from the accumulated gradients; t is the 1-based step count
static inline void optimizer_step(Optimizer* opt, GPT<float, float>* model, const OptimConfig* cfg, float lr, int t) {
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &model->config);
    opt->grad_norm = global_norm(model->grads, opt->n);
    float clip = (cfg->grad_clip > 0 && opt->grad_norm > cfg->grad_clip) ? (float)(cfg->grad_clip / opt->grad_norm) : 1.0f;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        size_t off = model->param[i] - model->params;
        adamw_update(model->param[i], model->grad[i], opt->m + off, opt->v + off, sizes[i], lr, cfg, t, clip,
                     param_is_matrix(i));
    }
}

#ifdef __CUDACC__
static inline void optimizer_step(Optimizer* opt, GPT<bf16, float>* model, const OptimConfig* cfg, float lr, int t) {
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &model->config);
    // the clip factor is computed on the device from the norm, so the step never waits for it
    global_norm_squared_cuda(opt->norm_sq, model->grads, opt->n, opt->scratch);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        size_t off = model->param[i] - model->params;
        adamw_update_cuda(opt->master + off, model->param[i], model->grad[i], opt->m + off, opt->v + off, sizes[i], lr,
                          cfg->beta1, cfg->beta2, cfg->eps, param_is_matrix(i) ? cfg->weight_decay : 0.0f, t,
                          opt->norm_sq, cfg->grad_clip);
    }
}
#endif
// the last step's gradient norm, on the host (on the GPU this waits for the step)
static inline double optimizer_grad_norm(Optimizer* opt) {
    if (opt->device == DEVICE_CUDA) {
        float norm_sq;
        device_copy(&norm_sq, opt->norm_sq, sizeof(float), DEVICE_CUDA);
        opt->grad_norm = sqrt((double)norm_sq);
    }
    return opt->grad_norm;
}

#endif // LLMC_OPTIMIZER_H
