/*
 The Hopper (sm_90a) instructions the attention and TwELL kernels are built
 on, as thin wrappers over their PTX:
 - wgmma: D[64 x N] (+)= A[64 x 16] B[16 x N], issued by the 4 warps of a
   warpgroup together and asynchronous (fence, commit, wait). Accumulators in
   the layout of mma.sync's, warp w of the warpgroup holding rows 16w..16w+15:
   d[n][e] is row 16w + lane/4 + 8(e/2), column 8n + 2(lane%4) + e%2.
   wgmma_abt: A and B K-major in shared memory (D = A B^T of two row-major
   tiles); wgmma_pb: A from registers in mma.sync's A layout (per warp its 16
   rows), B MN-major in shared memory (D += P B of a row-major tile B).
   `accumulate` 0 starts from zero.
 - shared memory descriptors of 128-byte-swizzled operands;
 - mbarriers (arrivals and transaction bytes), TMA loads of 2D tiles (one CTA,
   or multicast to the CTAs of a cluster), cluster rank and barrier (whole
   or in halves), a store into another CTA's shared memory;
 - on the host: the tensor maps TMA loads read, and whether the device runs
   the sm_90a code.
*/
#ifndef LLMC_CUDA_HOPPER_CUH
#define LLMC_CUDA_HOPPER_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include "llmc/cuda_common.cuh"

// whether the current device runs the sm_90a code (compute capability 9.x: H100, H200)
static inline bool device_has_wgmma() {
    static int major = -1; // a process drives one device
    if (major < 0) { major = device_attribute(cudaDevAttrComputeCapabilityMajor); }
    return major == 9;
}

// ----------------------------------------------------------------------------
// wgmma

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// waits until at most N of the warpgroup's committed groups of products are unfinished
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// an empty asm that reads and writes the registers: the compiler keeps their
// accesses on the same side of it as in the source (after a wait, say)
template <int NT>
__device__ __forceinline__ void fence_regs(float (&x)[NT][4]) {
    #pragma unroll
    for (int n = 0; n < NT; n++) {
        asm volatile("" : "+f"(x[n][0]), "+f"(x[n][1]), "+f"(x[n][2]), "+f"(x[n][3]) :: "memory");
    }
}

template <int NT>
__device__ __forceinline__ void fence_regs(uint32_t (&x)[NT][4]) {
    #pragma unroll
    for (int n = 0; n < NT; n++) {
        asm volatile("" : "+r"(x[n][0]), "+r"(x[n][1]), "+r"(x[n][2]), "+r"(x[n][3]) :: "memory");
    }
}

// makes this thread's cp.async writes to shared memory visible to the tensor cores (the async proxy)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// shared memory descriptor of a 128-byte-swizzled operand: start address,
// leading byte offset, stride byte offset 1024 (from one 8-row group to the next)
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t address, uint32_t leading_bytes) {
    return (uint64_t)((address & 0x3FFFF) >> 4) | (uint64_t)(leading_bytes >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 |
           1ull << 62;
}

#define WGMMA_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_REGS64 WGMMA_REGS32 ", " \
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_REGS128 WGMMA_REGS64 ", " \
                      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
                      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
                      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WGMMA_D(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define WGMMA_D8 WGMMA_D(0), WGMMA_D(1), WGMMA_D(2), WGMMA_D(3), WGMMA_D(4), WGMMA_D(5), WGMMA_D(6), WGMMA_D(7)
#define WGMMA_D16 WGMMA_D8, WGMMA_D(8), WGMMA_D(9), WGMMA_D(10), WGMMA_D(11), WGMMA_D(12), WGMMA_D(13), \
                  WGMMA_D(14), WGMMA_D(15)
#define WGMMA_D32 WGMMA_D16, WGMMA_D(16), WGMMA_D(17), WGMMA_D(18), WGMMA_D(19), WGMMA_D(20), WGMMA_D(21), \
                  WGMMA_D(22), WGMMA_D(23), WGMMA_D(24), WGMMA_D(25), WGMMA_D(26), WGMMA_D(27), WGMMA_D(28), \
                  WGMMA_D(29), WGMMA_D(30), WGMMA_D(31)

__device__ __forceinline__ void wgmma_abt(float (&d)[8][4], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WGMMA_REGS32 "}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D8 : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_abt(float (&d)[16][4], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_REGS64 "}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D16 : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_abt(float (&d)[32][4], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WGMMA_REGS128 "}, "
                 "%128, %129, p, 1, 1, 0, 0;\n}\n"
                 : WGMMA_D32 : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_pb(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WGMMA_REGS32 "}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WGMMA_D8 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_pb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_REGS64 "}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WGMMA_D16 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

#undef WGMMA_REGS32
#undef WGMMA_REGS64
#undef WGMMA_REGS128
#undef WGMMA_D
#undef WGMMA_D8
#undef WGMMA_D16
#undef WGMMA_D32

// ----------------------------------------------------------------------------
// mbarriers, TMA and clusters

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// waits until the phase of the given parity has completed
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned int parity) {
    unsigned int done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_address(bar)), "r"(parity) : "memory");
    } while (!done);
}
// the box at (x = column, y = row) of a 2D tensor map into shared memory, completing on bar
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int x, int y) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 ::"r"(smem_address(dst)), "l"(map), "r"(smem_address(bar)), "r"(x), "r"(y) : "memory");
}

__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// every thread of the cluster's CTAs; orders what each wrote before (shared memory included) before what all read after
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive;\nbarrier.cluster.wait;\n" ::: "memory");
}
// the two halves of cluster_sync apart, so that other work can run between them (each thread arrives once,
// then waits once, in turn); arrive_relaxed orders nothing
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait;\n" ::: "memory"); }
// v into the float at p's place in the shared memory of CTA `rank` of the cluster
__device__ __forceinline__ void store_shared_cluster(float* p, unsigned int rank, float v) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address(p)), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(v) : "memory");
}
// an arrival on the barrier at bar's place in the shared memory of CTA `rank` of the cluster
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, unsigned int rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address(bar)), "r"(rank));
    // release at CTA scope: the arriving threads only read the stage (a cluster-scope release is a fence
    // that stalled every consumer warp of the TwELL gate, dev/NOTES.md)
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// tma_load_2d into the same place of every CTA in cta_mask, each completing on its own bar
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int x, int y,
                                                      uint16_t cta_mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%3, %4}], [%2], %5;\n"
                 ::"r"(smem_address(dst)), "l"(map), "r"(smem_address(bar)), "r"(x), "r"(y), "h"(cta_mask) : "memory");
}

// ----------------------------------------------------------------------------
// host: tensor maps

typedef CUresult (*TensorMapEncoder)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// a [rows, cols] bf16 row-major matrix as a TMA map of boxes of box_rows x 64
// columns (128 bytes: the 128-byte swizzle); boxes past the edge read zeros
static inline CUtensorMap tma_map_bf16(const bf16* ptr, int rows, int cols, int box_rows) {
    static TensorMapEncoder encode = NULL;
    if (encode == NULL) { // the driver's entry point, without linking libcuda
        void* fn = NULL;
        cudaDriverEntryPointQueryResult found;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || fn == NULL) { fatal("TMA: the driver has no cuTensorMapEncodeTiled"); }
        encode = (TensorMapEncoder)fn;
    }
    CUtensorMap map;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)cols * sizeof(bf16)};
    cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    cuuint32_t element_strides[2] = {1, 1};
    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)ptr, dims, strides, box, element_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { fatal("TMA: cuTensorMapEncodeTiled failed (%d) for a %d x %d matrix", (int)r, rows, cols); }
    return map;
}

#endif // LLMC_CUDA_HOPPER_CUH
