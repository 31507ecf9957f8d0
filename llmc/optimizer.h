/*
 The optimizer state of a model and its step, for either backend: AdamW
 (llmc/adamw.h) with global-norm clipping, fp32 moments, and on the GPU fp32
 master weights from which the bf16 compute weights are rounded after every
 step. The moments (and master weights) are what checkpoints store, in fp32,
 so a checkpoint moves between the CPU and GPU paths.

 On the GPU the state covers the parameters this process owns (llmc/zero.h),
 packed in flat order: all of them with one process, a 1/P share with P
 data-parallel processes (ZeRO-1), whose gradients llmc/zero.cuh sums into
 owned_grads and whose new weights it all-gathers after the step.
*/
#ifndef LLMC_OPTIMIZER_H
#define LLMC_OPTIMIZER_H

#include "llmc/adamw.h"
#include "llmc/gpt.h"
#include "llmc/zero.h"
#ifdef __CUDACC__
#include "llmc/cuda_adamw.cuh"
#include "llmc/zero.cuh"
#else
typedef struct Zero Zero;
#endif

typedef struct {
    Device device;
    size_t n;           // parameters of the model
    size_t owned;       // parameters this process updates: n unless sharded
    ZeroLayout layout;  // which ones (GPU)
    Zero* zero;         // NULL with one process
    float* master;      // GPU: fp32 master weights (owned); CPU: NULL (the model's fp32 params are the master)
    float* m;           // first moments (owned), on the model's device
    float* v;           // second moments (owned)
    float* grads;       // GPU: summed gradients of the owned parameters (the model's own with one process)
    void* params;       // GPU: bf16 weights of the owned parameters (the model's own with one process)
    float* norm_sq;     // GPU: the squared gradient norm of the last step, on the device
    float* scratch;     // GPU: the norm's partial sums
    double grad_norm;   // the last step's gradient norm (read with the step's statistics)
    // what the FFN's hot-set hooks need (optimizer_units_permuted): the flat offsets of Wg, Wu, WdT, the
    // FFN's shape, and the model's full gradient buffer (GPU), scratch between steps
    size_t ffn_at[3];
    int hidden, channels;
    float* full;
} Optimizer;

// The FFN's hot-set hooks (llmc/ffn/hot.h), ctx = the optimizer: the layer's
// weights wait for data parallelism's all-gather before they move; a layer
// whose units were reordered (perm on the device) has every fp32 state of its
// Wg, Wu and WdT rows (master weights, moments) reordered the same way, so
// the optimizer goes on as before (with several processes each holds a share:
// the layer is gathered whole into the gradient buffer, which is scratch
// between steps, permuted, and each takes its share back); the costs one
// process measured become the mean over all, so every process makes the same
// choices.
static void optimizer_weights_needed(void* ctx, int layer) {
#ifdef __CUDACC__
    Optimizer* opt = (Optimizer*)ctx;
    if (opt->zero) { zero_params_needed(opt->zero, layer); }
#endif
}

static void optimizer_units_permuted(void* ctx, int l, const int* perm) {
    Optimizer* opt = (Optimizer*)ctx;
    const int H = opt->hidden, D = opt->channels;
    const size_t HD = (size_t)H * D;
    float* tmp = (float*)device_malloc(HD * sizeof(float), opt->device);
    float* states[3] = {opt->master, opt->m, opt->v};
    for (float* state : states) {
        if (state == NULL) { continue; } // (the CPU path's master weights are the model's parameters)
        float* rows = state;              // one process: the packed order is the flat order
#ifdef __CUDACC__
        if (opt->zero) {
            rows = opt->full;
            zero_join(opt->zero);
            zero_all_gather_layer(opt->zero, rows, state, l, main_stream);
        }
#endif
        for (size_t at : opt->ffn_at) { device_permute_rows(rows + at + l * HD, tmp, perm, H, D, opt->device); }
#ifdef __CUDACC__
        if (opt->zero) { zero_take_layer(opt->zero, state, rows, l); } // (rows holds layer l only)
#endif
    }
    device_free(tmp, opt->device);
}

// n values timed by this process -> their mean over the processes (on the host)
static void optimizer_agree(void* ctx, float* v, int n) {
#ifdef __CUDACC__
    Optimizer* opt = (Optimizer*)ctx;
    if (opt->zero == NULL) { return; }
    float* sum = (float*)device_malloc(n * sizeof(float), opt->device);
    device_copy(sum, v, n * sizeof(float), opt->device);
    zero_all_reduce_sum(opt->zero, sum, n);
    device_copy(v, sum, n * sizeof(float), opt->device);
    device_free(sum, opt->device);
    for (int i = 0; i < n; i++) { v[i] /= opt->zero->proc.size; }
#endif
}

// zero: the data-parallel group on the GPU, NULL for one process
template <typename T, typename G>
void optimizer_init(Optimizer* opt, GPT<T, G>* model, Zero* zero) {
    memset(opt, 0, sizeof(*opt));
    opt->device = model->device;
    opt->n = model->num_parameters;
    opt->owned = opt->n;
    opt->zero = zero;
    if (opt->device == DEVICE_CUDA) {
#ifdef __CUDACC__
        zero_layout_init(&opt->layout, &model->config, zero ? zero->proc.size : 1, zero ? zero->proc.rank : 0);
        opt->owned = opt->layout.owned;
        gpt_zero_grad(model); // the gradient buffer exists from here on (also a scratch for set/get_params)
        opt->master = (float*)device_malloc(opt->owned * sizeof(float), opt->device);
        opt->norm_sq = (float*)device_malloc(sizeof(float), opt->device);
        opt->scratch = (float*)device_malloc(GLOBAL_NORM_BLOCKS * sizeof(float), opt->device);
        if (zero) {
            opt->grads = (float*)device_malloc(opt->owned * sizeof(float), opt->device);
            opt->params = device_malloc(opt->owned * sizeof(bf16), opt->device);
            zero->grads = model->grads;
            zero->owned_grads = opt->grads;
            model->grads_ready = zero_grads_ready;
            model->grads_ready_ctx = zero;
            model->params_needed = zero_params_needed;
            model->params_needed_ctx = zero;
        } else {
            opt->grads = model->grads;
            opt->params = model->params;
        }
#endif
    }
    opt->m = (float*)device_malloc(opt->owned * sizeof(float), opt->device);
    opt->v = (float*)device_malloc(opt->owned * sizeof(float), opt->device);
    device_zero(opt->m, opt->owned * sizeof(float), opt->device);
    device_zero(opt->v, opt->owned * sizeof(float), opt->device);
    const int ffn_tensors[3] = {P_WG, P_WU, P_WDT};
    for (int i = 0; i < 3; i++) { opt->ffn_at[i] = (size_t)(model->param[ffn_tensors[i]] - model->params); }
    opt->hidden = model->config.hidden;
    opt->channels = model->config.channels;
    opt->full = (float*)model->grads;
    model->ffn.hooks = (FfnHotHooks){optimizer_weights_needed, optimizer_units_permuted, optimizer_agree, opt};
}

static inline void optimizer_free(Optimizer* opt) {
    device_free(opt->m, opt->device);
    device_free(opt->v, opt->device);
    device_free(opt->master, opt->device);
    device_free(opt->norm_sq, opt->device);
    device_free(opt->scratch, opt->device);
    if (opt->zero) {
        device_free(opt->grads, opt->device);
        device_free(opt->params, opt->device);
    }
    if (opt->layout.buckets) { zero_layout_free(&opt->layout); }
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
// packed <- the values of full[flat] that this process owns
static inline void optimizer_take_owned(const Optimizer* opt, float* packed, const float* full) {
    for (int i = 0; i < opt->layout.num_segments; i++) {
        const ZeroSegment* s = &opt->layout.segments[i];
        cudaCheck(cudaMemcpyAsync(packed + s->packed, full + s->offset, s->count * sizeof(float),
                                  cudaMemcpyDeviceToDevice, main_stream));
    }
}

// every process gets the same host values; the gradient buffer is the scratch
static inline void set_params_from_fp32(GPT<bf16, float>* model, Optimizer* opt, const float* host) {
    float* full = model->grads;
    device_copy(full, host, opt->n * sizeof(float), DEVICE_CUDA);
    round_to_bf16_cuda(model->params, full, opt->n);
    optimizer_take_owned(opt, opt->master, full);
}

// the fp32 master weights of every process (a collective when sharded: all
// processes call it); the gradient buffer is the scratch
static inline void get_params_fp32(GPT<bf16, float>* model, const Optimizer* opt, float* host) {
    if (opt->zero == NULL) {
        device_copy(host, opt->master, opt->n * sizeof(float), DEVICE_CUDA);
        return;
    }
    zero_all_gather(opt->zero, model->grads, opt->master);
    device_copy(host, model->grads, opt->n * sizeof(float), DEVICE_CUDA);
}
#endif

// one AdamW step from the accumulated gradients; t is the 1-based step count.
// A step whose loss (the model's summed statistics) or gradient norm is not
// finite changes nothing: the weights and moments stay as they were.
static inline void optimizer_step(Optimizer* opt, GPT<float, float>* model, const OptimConfig* cfg, float lr, int t) {
    size_t sizes[NUM_PARAM_TENSORS];
    param_sizes(sizes, &model->config);
    opt->grad_norm = global_norm(model->grads, opt->n);
    if (!isfinite(opt->grad_norm) || !isfinite(model->stats_acc[0])) { return; }
    float clip = (cfg->grad_clip > 0 && opt->grad_norm > cfg->grad_clip) ? (float)(cfg->grad_clip / opt->grad_norm) : 1.0f;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        size_t off = model->param[i] - model->params;
        adamw_update(model->param[i], model->grad[i], opt->m + off, opt->v + off, sizes[i], lr, cfg, t, clip,
                     param_is_matrix(i));
    }
}

#ifdef __CUDACC__
// with P processes the gradients must have been reduced (zero_join after the
// backward) and the statistics summed; the new weights are then gathered while
// the next forward runs. The kernel skips a step whose summed loss or gradient
// norm is not finite, as on the CPU, without the host waiting for either.
static inline void optimizer_step(Optimizer* opt, GPT<bf16, float>* model, const OptimConfig* cfg, float lr, int t) {
    // the clip factor is computed on the device from the norm, so the step never waits for it
    global_norm_squared_cuda(opt->norm_sq, opt->grads, opt->owned, opt->scratch);
    if (opt->zero) { zero_all_reduce_sum(opt->zero, opt->norm_sq, 1); }
    // one update per run of packed parameters with the same weight decay
    const ZeroLayout* z = &opt->layout;
    for (int i = 0; i < z->num_segments;) {
        int j = i + 1;
        while (j < z->num_segments && z->segments[j].decay == z->segments[i].decay) { j++; }
        size_t first = z->segments[i].packed, count = z->segments[j - 1].packed + z->segments[j - 1].count - first;
        adamw_update_cuda(opt->master + first, (bf16*)opt->params + first, opt->grads + first, opt->m + first,
                          opt->v + first, count, lr, cfg->beta1, cfg->beta2, cfg->eps,
                          z->segments[i].decay ? cfg->weight_decay : 0.0f, t, opt->norm_sq, cfg->grad_clip,
                          model->stats_acc);
        i = j;
    }
    if (opt->zero) { zero_all_gather_params(opt->zero, model->params, (const bf16*)opt->params); }
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
