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
} Optimizer;

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

// Layer l's FFN units in a new order, perm[i] = the unit that goes to i (host):
// the rows of Wg, Wu and WdT in the weights and in every fp32 state of them
// (master weights, moments), so that the model stays the same function and the
// optimizer goes on as before. Called between steps (the gradients are zeroed
// before the next one). With several processes each holds a share of the
// state: the layer is gathered whole, permuted and each takes its share back.
template <typename T, typename G>
void optimizer_permute_units(Optimizer* opt, GPT<T, G>* model, int l, const int* perm) {
    const int H = model->config.hidden, D = model->config.channels, ffn[3] = {P_WG, P_WU, P_WDT};
    const size_t HD = (size_t)H * D;
    if (model->params_needed) { model->params_needed(model->params_needed_ctx, l); }
    int* dev_perm = (int*)device_malloc(H * sizeof(int), model->device);
    device_copy(dev_perm, perm, H * sizeof(int), model->device);
    T* tmp = (T*)device_malloc(HD * sizeof(float), model->device);
    gpt_permute_units(model, l, dev_perm, tmp);
    float* states[3] = {opt->master, opt->m, opt->v};
    for (float* state : states) {
        if (state == NULL) { continue; } // (the CPU path's master weights are the model's parameters)
        if (opt->zero == NULL) { // one process: the packed order is the flat order
            for (int i : ffn) {
                size_t at = (size_t)(model->param[i] - model->params) + l * HD;
                device_permute_rows(state + at, (float*)tmp, dev_perm, H, D, model->device);
            }
            continue;
        }
#ifdef __CUDACC__
        float* full = model->grads;
        zero_join(opt->zero);
        zero_all_gather_layer(opt->zero, full, state, l, main_stream);
        for (int i : ffn) {
            size_t at = (size_t)(model->param[i] - model->params) + l * HD;
            device_permute_rows(full + at, (float*)tmp, dev_perm, H, D, model->device);
        }
        zero_take_layer(opt->zero, state, full, l); // (full holds layer l only)
#endif
    }
    device_free(tmp, model->device);
    device_free(dev_perm, model->device);
}

// The hot/cold split after optimizer step `step` of `tokens` tokens (llmc/ffn.h):
// the costs are measured once where the run asks for them (dense1 < 0), then
// every FFN_HOT_EVERY steps every sparse layer's hot set is re-chosen from the
// step's counts (gpt_hot_choose); a layer whose set changes gets its units
// permuted (the choice depends on the step's number, not on when a run
// started, so a resumed run makes the same ones). Every
// process makes the same choices (the counts are summed over them, the costs
// are their mean). Logs the costs and each change when verbose.
template <typename T, typename G>
void optimizer_hot_update(Optimizer* opt, GPT<T, G>* model, int step, double tokens, int verbose) {
    const int L = model->config.num_layers, H = model->config.hidden;
    FfnCosts* costs = &model->hot_costs;
    if (costs->dense1 < 0) {
        int probe = -1;
        for (int l = 0; l < L && probe < 0; l++) {
            if (model->ffn[l].on && model->ffn[l].hot.units == 0 && model->ffn[l].p.M > 0) { probe = l; }
        }
        if (probe < 0) { return; } // measured once a layer has run sparse
        *costs = gpt_hot_costs(model, probe, verbose);
        if (opt->zero) {
#ifdef __CUDACC__
            float* sum = (float*)device_malloc(sizeof(FfnCosts), model->device);
            device_copy(sum, costs, sizeof(FfnCosts), model->device);
            zero_all_reduce_sum(opt->zero, sum, 4);
            device_copy(costs, sum, sizeof(FfnCosts), model->device);
            device_free(sum, model->device);
            float* v[4] = {&costs->dense0, &costs->dense1, &costs->gate1, &costs->pair1};
            for (float* x : v) { *x /= opt->zero->proc.size; }
#endif
        }
    }
    if ((costs->dense1 <= 0 && costs->dense0 <= 0) || step % FFN_HOT_EVERY != 0) { return; } // (none: all zero)
    int* perm = (int*)mallocCheck(H * sizeof(int));
    for (int l = 0; l < L; l++) {
        SparseFfnLayer<T>* f = &model->ffn[l];
        if (!f->on) { continue; }
        int units = gpt_hot_choose(model, l, tokens, perm);
        if (units < 0) { continue; }
        optimizer_permute_units(opt, model, l, perm);
        if (verbose) {
            int joined = 0;
            for (int n = 0; n < units; n++) { joined += perm[n] >= f->hot.units; }
            printf("ffn: layer %d: %d -> %d hot units (%d joined, %d left), %.0f%% of the firing\n", l, f->hot.units,
                   units, joined, f->hot.units - (units - joined),
                   100 * ffn_hot_share(model->unit_count_host + (size_t)l * H, perm, H, units));
        }
        f->hot.units = units;
    }
    free(perm);
}

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
