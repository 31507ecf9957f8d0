/*
 What every CUDA file shares: checked CUDA calls, the one stream the model's
 work is queued on, device allocation with a clear out-of-memory message, and
 the bf16 type of activations and weights on the GPU.
*/
#ifndef LLMC_CUDA_COMMON_CUH
#define LLMC_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "llmc/utils.h"

typedef __nv_bfloat16 bf16;

static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) { fatal("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err)); }
}
#define cudaCheck(err) cuda_check((err), __FILE__, __LINE__)

// the stream all of a step's work is queued on (the default stream until set)
static cudaStream_t main_stream = 0;

// cudaMalloc, or one line saying how much was asked for and how much is free
static inline void* cuda_malloc(size_t bytes) {
    void* ptr = NULL;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total = 0;
        cudaGetLastError(); // clear the error so the query below works
        cudaMemGetInfo(&free_bytes, &total);
        fatal("GPU out of memory: asked for %.2f GiB, %.2f GiB free of %.2f GiB (try a smaller --batch)",
              bytes / 1073741824.0, free_bytes / 1073741824.0, total / 1073741824.0);
    }
    cudaCheck(err);
    return ptr;
}

static inline void cuda_free(void* ptr) {
    if (ptr) { cudaCheck(cudaFree(ptr)); }
}

static inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// an attribute of the current device (the number of SMs, the compute capability, ...)
static inline int device_attribute(cudaDeviceAttr attr) {
    int device = 0, value = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&value, attr, device));
    return value;
}

// out = bf16(in), rounded to nearest (n values on the device)
__global__ void round_to_bf16_kernel(bf16* out, const float* in, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = __float2bfloat16_rn(in[i]);
    }
}

static inline void round_to_bf16_cuda(bf16* out, const float* in, size_t n) {
    round_to_bf16_kernel<<<1024, 256, 0, main_stream>>>(out, in, n);
    cudaCheck(cudaGetLastError());
}

// out [n] on the device = bf16(in [n] on the host), through an fp32 staging buffer of at most 256 MiB
static inline void upload_bf16(bf16* out, const float* in, size_t n) {
    size_t chunk = (size_t)1 << 26;
    float* staging = (float*)cuda_malloc((n < chunk ? n : chunk) * sizeof(float));
    for (size_t off = 0; off < n; off += chunk) {
        size_t count = n - off < chunk ? n - off : chunk;
        cudaCheck(cudaMemcpyAsync(staging, in + off, count * sizeof(float), cudaMemcpyHostToDevice, main_stream));
        round_to_bf16_cuda(out + off, staging, count);
    }
    cudaCheck(cudaStreamSynchronize(main_stream));
    cuda_free(staging);
}

// ----------------------------------------------------------------------------
// A CUDA graph of the work that `body` queues on main_stream, captured at the
// first launch and launched again while `key` stays the same (a new key
// captures it again). A launch that captures runs body as ordinary launches
// (in which cuBLASLt picks its algorithms and kernels set their attributes:
// nothing of that kind may happen inside a capture) and only captures it
// then, so that the work runs once per launch (it may add to counters).

typedef struct {
    cudaGraphExec_t exec; // NULL until the first launch
    long long key;
} CudaGraph;

template <typename Body>
static void cuda_graph_launch(CudaGraph* g, long long key, Body body) {
    if (g->exec == NULL || g->key != key) {
        if (g->exec) { cudaCheck(cudaGraphExecDestroy(g->exec)); g->exec = NULL; }
        body();
        cudaGraph_t graph;
        cudaCheck(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeThreadLocal));
        body();
        cudaCheck(cudaStreamEndCapture(main_stream, &graph));
        cudaCheck(cudaGraphInstantiate(&g->exec, graph, 0));
        cudaCheck(cudaGraphDestroy(graph));
        g->key = key;
        return;
    }
    cudaCheck(cudaGraphLaunch(g->exec, main_stream));
}

static inline void cuda_graph_free(CudaGraph* g) {
    if (g->exec) { cudaCheck(cudaGraphExecDestroy(g->exec)); }
    g->exec = NULL;
}

// ----------------------------------------------------------------------------
// programmatic dependent launch (compute capability 9.0): a kernel launched by
// launch_early may start while the kernel before it in the stream still runs,
// so it can fetch weights (which nothing in the stream writes) meanwhile. It
// must call grid_dependency_wait() before it reads anything an earlier kernel
// wrote or writes anything an earlier kernel reads; grid_dependents_launch()
// lets the next such kernel start. On older GPUs both are no-ops and
// launch_early is an ordinary launch.

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

static inline bool early_launch_supported(void) {
    static int major = -1; // a process drives one device
    if (major < 0) { major = device_attribute(cudaDevAttrComputeCapabilityMajor); }
    return major >= 9;
}

// launch_early in clusters of `cluster` blocks along x (1: no clusters; more needs compute capability 9.0)
template <typename... Params, typename... Args>
static void launch_early_clusters(int cluster, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                  Args... args) {
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = 1;
    attrs[1].id = cudaLaunchAttributeClusterDimension;
    attrs[1].val.clusterDim.x = (unsigned int)cluster, attrs[1].val.clusterDim.y = 1, attrs[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = main_stream;
    config.attrs = early_launch_supported() ? attrs : attrs + 1;
    config.numAttrs = (early_launch_supported() ? 1 : 0) + (cluster > 1 ? 1 : 0);
    cudaCheck(cudaLaunchKernelEx(&config, kernel, ((Params)args)...));
}

template <typename... Params, typename... Args>
static void launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args... args) {
    launch_early_clusters(1, kernel, grid, block, smem, args...);
}

// An SM divides its on-chip memory between L1 and shared memory when blocks
// land on it, by what they ask for, and a block that needs more shared memory
// than the current split gives cannot join the blocks already there. In a chain
// of early launches whose kernels need different amounts (a GEMV's few KB, then
// an attention's 35) the next kernel stays off the SMs until they drain, unless
// the kernels of the chain ask for the largest split.
template <typename Kernel>
static void prefer_shared_memory(Kernel kernel) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

// ----------------------------------------------------------------------------
// device helpers shared by the kernels

// eight bf16 moved as one 16-byte access: the unit of the memory-bound kernels
// (the address must be 16-byte aligned)
struct alignas(16) Bf16x8 { bf16 v[8]; };

__device__ __forceinline__ Bf16x8 load_bf16x8(const bf16* p) {
    int4 bits = *reinterpret_cast<const int4*>(p);
    Bf16x8 x;
    memcpy(&x, &bits, sizeof(bits));
    return x;
}

__device__ __forceinline__ void store_bf16x8(bf16* p, const Bf16x8& x) {
    int4 bits;
    memcpy(&bits, &x, sizeof(bits));
    *reinterpret_cast<int4*>(p) = bits;
}

// L2 eviction priorities (sm_80+): rows gathered many times (weights) marked
// evict_last stay in L2 while rows streamed once (activations) marked
// evict_first leave it first
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

__device__ __forceinline__ uint64_t l2_policy_evict_first() {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// 16 bytes (16-byte aligned) under an L2 policy
__device__ __forceinline__ uint4 load_16_policy(const void* p, uint64_t policy) {
    uint4 v;
    asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
    return v;
}

__device__ __forceinline__ Bf16x8 load_bf16x8_policy(const bf16* p, uint64_t policy) {
    uint4 bits = load_16_policy(p, policy);
    Bf16x8 x;
    memcpy(&x, &bits, sizeof(bits));
    return x;
}

__device__ __forceinline__ void store_bf16x8_policy(bf16* p, const Bf16x8& x, uint64_t policy) {
    uint4 bits;
    memcpy(&bits, &x, sizeof(bits));
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                 ::"l"(p), "r"(bits.x), "r"(bits.y), "r"(bits.z), "r"(bits.w), "l"(policy) : "memory");
}

// cp.async (compute capability 8.0): global -> shared without passing through registers

__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, asynchronously; zeros when !valid
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_address(dst)), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_address(dst)), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// waits until at most N of this thread's groups are still in flight
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

// mma.sync (compute capability 8.0), bf16 in, fp32 accumulated:
// c[16x8] += a[16x16] b[16x8]. Lane l (g = l/4, i = l%4) holds a: rows g, g+8 x
// cols 2i, 2i+1, 2i+8, 2i+9; b: rows 2i, 2i+1, 2i+8, 2i+9 x col g; c: rows g, g+8
// x cols 2i, 2i+1 (c[0], c[1] in row g, c[2], c[3] in row g+8)
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the operations of the reductions below
struct Sum { template <typename T> __device__ T operator()(T a, T b) const { return a + b; } };
struct Max { template <typename T> __device__ T operator()(T a, T b) const { return a > b ? a : b; } };

// butterfly over the 32 lanes of a warp: every lane gets the same result, in
// the same order on every run
template <typename Op, typename T>
__device__ __forceinline__ T warp_reduce(T x) {
    for (int offset = 16; offset > 0; offset /= 2) { x = Op()(x, __shfl_xor_sync(0xffffffffu, x, offset)); }
    return x;
}

// inclusive prefix sum over the lanes: lane l gets x_0 + ... + x_l
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T x) {
    const int lane = threadIdx.x % 32;
    #pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
        T y = __shfl_up_sync(0xffffffffu, x, offset);
        if (lane >= offset) { x += y; }
    }
    return x;
}

// reduction over a whole block (blockDim.x a multiple of 32): each warp
// reduces, then thread 0 combines the warps in order; every thread gets the
// result. May be called again right away (the first barrier of the next call
// comes after every thread has read this call's result).
template <typename Op, typename T>
__device__ T block_reduce(T x) {
    __shared__ T warp_results[32];
    __shared__ T result;
    x = warp_reduce<Op>(x);
    if (threadIdx.x % 32 == 0) { warp_results[threadIdx.x / 32] = x; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / 32; w++) { x = Op()(x, warp_results[w]); }
        result = x;
    }
    __syncthreads();
    return result;
}

// Whether this block is the last of `blocks` to get here, counted in *counter,
// which the last one sets back to 0 for the next launch. Every thread of the
// block calls it after its global writes; the last block may then read what the
// others wrote. One fence a block, by the thread that counts it (the pattern of a
// cooperative grid barrier): the barrier orders the block's writes before that
// fence, which publishes them all; a fence in every thread cost the decode
// attention ~8% of its stall samples.
__device__ bool block_arrives_last(int* counter, int blocks) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(counter, 1) == blocks - 1;
        if (last) {
            *counter = 0;
            __threadfence(); // the others' writes, seen by the block after the barrier below
        }
    }
    __syncthreads();
    return last;
}

#endif // LLMC_CUDA_COMMON_CUH
