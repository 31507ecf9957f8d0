/*
 What a dependency between two phases of a decode step costs on this GPU. The
 step is a chain of kernels today, each launched early (programmatic dependent
 launch: it loads its weights, then waits for the kernel before it); a
 persistent kernel would wait on a counter in global memory instead (dev/
 NOTES.md, "Where the batch-1 step stands"). Both are timed over N phases of
 one 256-thread block an SM. In phase p every block reads all blocks' values of
 phase p - 1 (a stand-in for the activation row every block of a GEMV reads),
 and writes its own:
     v_p[b] = mean_b' v_(p-1)[b'] / 2 + p + b / 1000      (v_0[b] = 1)
 and before it waits it loads 64 KB of weights of its own into registers
 (which nothing writes, as the decode kernels load their rows before the wait),
 XORed together after the wait: their latency can hide behind it.
   - kernels: N kernels, each launched early, in a CUDA graph;
   - counter: one kernel of N phases, its blocks all resident (a cooperative
     launch); a block writes its value, fences, adds 1 to the phase's counter,
     and its thread 0 spins until the counter of the phase before holds them all.
 Each run's values are checked against the chain computed on the host (a block
 that read a stale phase would be off by about one half), then each is timed
 (median of `reps` runs), printed as us per phase, without and with the weights.
 usage: build/dev/bench_phase_wait [phases (200)] [reps (20)]
*/
#include <vector>
#include "test/gpu/gpu_util.cuh"

constexpr int PHASE_THREADS = 256, PHASE_WORDS = 16; // 16-byte words of weights a thread: 64 KB a block

// the block's weights of phase p into registers (none without weights)
struct PhaseWeights {
    uint4 v[PHASE_WORDS];
};

__device__ __forceinline__ void phase_weights_load(PhaseWeights* r, const uint4* w, int p) {
    if (w == NULL) { return; }
    const uint4* mine = w + ((size_t)p * gridDim.x + blockIdx.x) * PHASE_WORDS * PHASE_THREADS;
    #pragma unroll
    for (int i = 0; i < PHASE_WORDS; i++) { r->v[i] = __ldcs(mine + i * PHASE_THREADS + threadIdx.x); }
}

__device__ __forceinline__ uint32_t phase_weights_xor(const PhaseWeights& r, const uint4* w) {
    uint32_t acc = 0;
    if (w == NULL) { return acc; }
    #pragma unroll
    for (int i = 0; i < PHASE_WORDS; i++) { acc ^= r.v[i].x ^ r.v[i].y ^ r.v[i].z ^ r.v[i].w; }
    return acc;
}

// phase p's value of this block from the values of phase p - 1 (every block's)
__device__ float phase_value(const float* before, int p) {
    float s = 0.0f;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += PHASE_THREADS) { s += __ldcg(before + b); } // (L2: other SMs wrote it)
    s = block_reduce<Sum>(s);
    return s / gridDim.x * 0.5f + p + blockIdx.x / 1000.0f;
}

__global__ void __launch_bounds__(PHASE_THREADS)
phase_kernel(float* out, const float* before, const uint4* w, int p, uint32_t* sink) {
    PhaseWeights r;
    phase_weights_load(&r, w, p);
    grid_dependents_launch();
    grid_dependency_wait();
    const float v = phase_value(before, p + 1);
    if (threadIdx.x == 0) { out[blockIdx.x] = v; }
    if (phase_weights_xor(r, w) == 0x9e3779b9u) { atomicAdd(sink, 1u); } // (never: the loads are used, so waited for)
}

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// vals [phases + 1][blocks] (row 0 given), counters [phases] zero
__global__ void __launch_bounds__(PHASE_THREADS)
phase_persistent_kernel(float* vals, unsigned int* counters, const uint4* w, int phases, uint32_t* sink) {
    uint32_t acc = 0;
    for (int p = 1; p <= phases; p++) {
        PhaseWeights r;
        phase_weights_load(&r, w, p - 1);
        if (p > 1) { // the values of phase p - 1, from every block
            if (threadIdx.x == 0) { while (load_acquire(&counters[p - 2]) < gridDim.x) {} }
            __syncthreads();
        }
        const float v = phase_value(vals + (size_t)(p - 1) * gridDim.x, p);
        acc ^= phase_weights_xor(r, w);
        if (threadIdx.x == 0) {
            vals[(size_t)p * gridDim.x + blockIdx.x] = v;
            __threadfence();
            atomicAdd(&counters[p - 1], 1u);
        }
    }
    if (acc == 0x9e3779b9u) { atomicAdd(sink, 1u); } // (never: the loads are used, so waited for)
}

int main(int argc, char** argv) {
    const int phases = argc > 1 ? atoi(argv[1]) : 200, reps = argc > 2 ? atoi(argv[2]) : 20;
    if (phases < 2 || reps < 1) { fatal("usage: bench_phase_wait [phases >= 2] [reps >= 1]"); }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (!prop.cooperativeLaunch) { fatal("%s: no cooperative launch, which the counter version needs", prop.name); }
    const int blocks = prop.multiProcessorCount;
    cudaCheck(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
    // the chain on the host
    std::vector<double> ref(blocks, 1.0), next(blocks);
    for (int p = 1; p <= phases; p++) {
        double mean = 0;
        for (double v : ref) { mean += v; }
        mean /= blocks;
        for (int b = 0; b < blocks; b++) { next[b] = mean * 0.5 + p + b / 1000.0; }
        ref = next;
    }
    float* vals = (float*)cuda_malloc((size_t)(phases + 1) * blocks * sizeof(float));
    unsigned int* counters = (unsigned int*)cuda_malloc(phases * sizeof(unsigned int));
    uint32_t* sink = (uint32_t*)cuda_malloc(sizeof(uint32_t));
    float* ones = upload(std::vector<float>(blocks, 1.0f)); // row 0 of every run
    printf("%s, %d blocks of %d threads, %d phases\n", prop.name, blocks, PHASE_THREADS, phases);
    for (int with_weights = 0; with_weights < 2; with_weights++) {
        const size_t bytes = (size_t)PHASE_WORDS * PHASE_THREADS * 16 * blocks * phases;
        uint4* w = with_weights ? (uint4*)cuda_malloc(bytes) : NULL;
        if (w) { cudaCheck(cudaMemset(w, 1, bytes)); }
        auto reset = [&] {
            cudaCheck(cudaMemcpyAsync(vals, ones, blocks * sizeof(float), cudaMemcpyDeviceToDevice, main_stream));
            cudaCheck(cudaMemsetAsync(vals + blocks, 0xFF, (size_t)phases * blocks * sizeof(float), main_stream));
            cudaCheck(cudaMemsetAsync(counters, 0, phases * sizeof(unsigned int), main_stream));
        };
        auto chain = [&] {
            for (int p = 1; p <= phases; p++) {
                launch_early(phase_kernel, blocks, PHASE_THREADS, 0, vals + (size_t)p * blocks,
                             (const float*)(vals + (size_t)(p - 1) * blocks), (const uint4*)w, p - 1, sink);
            }
        };
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        cudaCheck(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeThreadLocal));
        chain();
        cudaCheck(cudaStreamEndCapture(main_stream, &graph));
        cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
        auto kernels = [&] { cudaCheck(cudaGraphLaunch(exec, main_stream)); };
        auto persistent = [&] {
            void* args[] = {&vals, &counters, &w, (void*)&phases, &sink};
            cudaCheck(cudaLaunchCooperativeKernel((void*)phase_persistent_kernel, blocks, PHASE_THREADS, args, 0,
                                                  main_stream));
        };
        const char* names[2] = {"kernels, launched early", "one kernel, counters"};
        std::function<void()> runs[2] = {kernels, persistent};
        for (int k = 0; k < 2; k++) {
            reset();
            runs[k]();
            std::vector<float> got = download(vals + (size_t)phases * blocks, blocks);
            double worst = 0;
            for (int b = 0; b < blocks; b++) { worst = isnan(got[b]) ? INFINITY : fmax(worst, fabs(got[b] - ref[b]) / ref[b]); }
            if (worst > 1e-4) { fatal("%s: phase %d's values off the host's chain by %g", names[k], phases, worst); }
            const float ms = median_ms([&] { reset(); runs[k](); }, reps, 1);
            const float reset_ms = median_ms(reset, reps, 1);
            printf("  %-24s %s: %6.2f us a phase\n", names[k], with_weights ? "64 KB of weights a block" : "no weights",
                   1e3 * (ms - reset_ms) / phases);
        }
        cudaCheck(cudaGraphExecDestroy(exec));
        cudaCheck(cudaGraphDestroy(graph));
        if (w) { cuda_free(w); }
    }
    cuda_free(vals);
    cuda_free(ones);
    cuda_free(counters);
    cuda_free(sink);
    return 0;
}
