/*
 The optimizer step on the CPU path: global-norm gradient clipping and AdamW
 with decoupled weight decay (applied to matrices only), fp32 moments:
     m = b1 m + (1-b1) g,  v = b2 v + (1-b2) g^2
     p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
 and the warmup + cosine learning-rate schedule.
*/
#ifndef LLMC_ADAMW_H
#define LLMC_ADAMW_H

#include <math.h>
#include <stddef.h>

typedef struct {
    float lr;            // peak learning rate
    float beta1, beta2, eps;
    float weight_decay;
    float grad_clip;     // max global gradient norm (0 = no clipping)
    int warmup_steps;
    int total_steps;
    float final_lr_frac; // the cosine decays to lr * final_lr_frac
} OptimConfig;

// linear warmup from lr/warmup to lr, then cosine down to lr * final_lr_frac
static inline float lr_at_step(const OptimConfig* o, int step) {
    if (step < o->warmup_steps) { return o->lr * (step + 1) / o->warmup_steps; }
    int decay_steps = o->total_steps - o->warmup_steps;
    if (decay_steps <= 0) { return o->lr; }
    double progress = (double)(step - o->warmup_steps) / decay_steps;
    if (progress > 1) { progress = 1; }
    double floor_lr = o->lr * o->final_lr_frac;
    return (float)(floor_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (o->lr - floor_lr));
}

template <typename T>
double global_norm(const T* grads, size_t n) {
    double sum = 0;
    #pragma omp parallel for reduction(+:sum)
    for (size_t i = 0; i < n; i++) { sum += (double)grads[i] * grads[i]; }
    return sqrt(sum);
}

// one AdamW step over n parameters; t is the 1-based step count,
// grad_scale multiplies every gradient (the clipping factor)
template <typename T>
void adamw_update(T* params, const T* grads, float* m, float* v, size_t n, float lr, const OptimConfig* o,
                  int t, float grad_scale, int decay) {
    float b1_correction = 1.0f - powf(o->beta1, (float)t);
    float b2_correction = 1.0f - powf(o->beta2, (float)t);
    float wd = decay ? o->weight_decay : 0.0f;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = (float)grads[i] * grad_scale;
        m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * g;
        v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * g * g;
        float m_hat = m[i] / b1_correction;
        float v_hat = v[i] / b2_correction;
        float p = (float)params[i];
        params[i] = (T)(p - lr * (m_hat / (sqrtf(v_hat) + o->eps) + wd * p));
    }
}

#endif // LLMC_ADAMW_H
