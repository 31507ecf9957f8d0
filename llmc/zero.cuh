/*
 Data parallelism over NCCL with ZeRO-1: one process per GPU, each with the
 whole model and its own slice of every batch; the optimizer state is sharded.
 Per optimizer step, with P processes and the buckets of llmc/zero.h:
   backward of the last micro-batch: as soon as layer l's gradients are final,
       its buckets are reduce-scattered on a second stream (summed over the
       processes; each process receives the sums of the parameters it owns),
       while the backward goes on with layer l-1;
   optimizer: the gradient norm of the owned parameters, summed over the
       processes; AdamW on the owned parameters (fp32 master weights and
       moments, packed); then every bucket's new bf16 weights are all-gathered
       on the second stream, layer by layer in the order the next forward
       reads them, so the forward of layer l waits only for layer l's weights.
 Every collective of a step is ordered after the one before it through the
 two streams' events, so no two ever run at once on the communicator.
 The loss and sparsity statistics are summed (maxima: maximised) over the
 processes before they are read, and with them a flag that says whether
 any process was asked to stop (a signal), so that all stop at the same step.
 Ranks meet through MPI (when built with it and started by mpirun), a TCP
 address or a shared file (llmc/rendezvous.h).
*/
#ifndef LLMC_ZERO_CUH
#define LLMC_ZERO_CUH

#include <nccl.h>
#ifdef USE_MPI
#include <mpi.h>
#endif
#include "llmc/cuda_common.cuh"
#include "llmc/rendezvous.h"
#include "llmc/zero.h"

static inline void nccl_check(ncclResult_t r, const char* file, int line) {
    if (r != ncclSuccess) { fatal("NCCL error at %s:%d: %s (%s)", file, line, ncclGetErrorString(r), ncclGetLastError(NULL)); }
}
#define ncclCheck(call) nccl_check((call), __FILE__, __LINE__)

typedef struct Zero {
    ProcessInfo proc;
    ZeroLayout layout;
    ncclComm_t comm;
    cudaStream_t stream;       // the reduce-scatters and all-gathers that overlap the backward and forward
    cudaEvent_t event;
    cudaEvent_t* gathered;     // [L + 1] layer l - 1's weights are all-gathered (0: wte and the final norm)
    int reduce_in_backward;    // 1 during the backward of a step's last micro-batch
    const float* grads;        // the model's gradients, flat
    float* owned_grads;        // the summed gradients of the owned parameters, packed
    double* stats_sum;         // scratch: the statistics summed over processes
    int stats_capacity;
    int mpi;                   // MPI was initialised (and must be finalised)
} Zero;

// How the ranks meet: "mpi", "tcp" (address host:port) or "file" (a path every
// rank sees); "auto" picks mpi when built with MPI and started by mpirun, else
// tcp when an address is given, else file when a path is given.
static inline void zero_init(Zero* z, const ProcessInfo* proc, const GPTConfig* config, const char* method,
                             const char* address, const char* file, double timeout_s) {
    memset(z, 0, sizeof(*z));
    z->proc = *proc;
    int from_mpirun = strncmp(proc->launcher, "mpirun", 6) == 0;
#ifdef USE_MPI
    int have_mpi = 1;
#else
    int have_mpi = 0;
#endif
    if (strcmp(method, "auto") == 0) {
        method = from_mpirun && have_mpi ? "mpi" : address[0] ? "tcp" : file[0] ? "file" : "";
        if (method[0] == '\0') {
            fatal("%d processes (from %s) but no way for them to meet: give --init-address host:port or --init-file PATH%s",
                  proc->size, proc->launcher, have_mpi ? "" : " (this build has no MPI)");
        }
    }
    ncclUniqueId id;
    if (proc->rank == 0) { ncclCheck(ncclGetUniqueId(&id)); }
    if (strcmp(method, "mpi") == 0) {
#ifdef USE_MPI
        int initialised = 0;
        MPI_Initialized(&initialised);
        if (!initialised) { MPI_Init(NULL, NULL); }
        z->mpi = !initialised;
        int rank, size;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (rank != proc->rank || size != proc->size) {
            fatal("MPI says rank %d of %d, the environment %d of %d", rank, size, proc->rank, proc->size);
        }
        MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
#else
        fatal("--init mpi: this build has no MPI (build with an MPI compiler wrapper present, or use --init tcp / file)");
#endif
    } else if (strcmp(method, "tcp") == 0) {
        if (!address[0]) { fatal("--init tcp needs --init-address host:port"); }
        rendezvous_tcp(address, proc, &id, sizeof(id), timeout_s);
    } else if (strcmp(method, "file") == 0) {
        if (!file[0]) { fatal("--init file needs --init-file PATH"); }
        rendezvous_file(file, proc, &id, sizeof(id), timeout_s);
    } else {
        fatal("--init must be auto, mpi, tcp or file, not '%s'", method);
    }
    ncclCheck(ncclCommInitRank(&z->comm, proc->size, id, proc->rank));
    // the highest priority: the collectives' blocks take SMs as the compute kernels free them
    int least_priority, greatest_priority;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
    cudaCheck(cudaStreamCreateWithPriority(&z->stream, cudaStreamNonBlocking, greatest_priority));
    cudaCheck(cudaEventCreateWithFlags(&z->event, cudaEventDisableTiming));
    z->gathered = (cudaEvent_t*)mallocCheck((config->num_layers + 1) * sizeof(cudaEvent_t));
    for (int l = 0; l <= config->num_layers; l++) {
        cudaCheck(cudaEventCreateWithFlags(&z->gathered[l], cudaEventDisableTiming));
    }
    zero_layout_init(&z->layout, config, proc->size, proc->rank);
}

static inline void zero_free(Zero* z) {
    cudaCheck(cudaStreamSynchronize(z->stream));
    ncclCheck(ncclCommDestroy(z->comm));
    cudaCheck(cudaStreamDestroy(z->stream));
    cudaCheck(cudaEventDestroy(z->event));
    for (int l = 0; l <= z->layout.num_layers; l++) { cudaCheck(cudaEventDestroy(z->gathered[l])); }
    free(z->gathered);
    cuda_free(z->stats_sum);
    zero_layout_free(&z->layout);
#ifdef USE_MPI
    if (z->mpi) { MPI_Finalize(); }
#endif
    memset(z, 0, sizeof(*z));
}

// calls visit(offset in flat, offset in packed, count / P, count % P) for each
// bucket of `layer`, as one NCCL group
template <typename Visit>
static void zero_layer_buckets(Zero* z, int layer, Visit visit) {
    const size_t P = (size_t)z->proc.size;
    ncclCheck(ncclGroupStart());
    for (int b = 0; b < z->layout.num_buckets; b++) {
        const ZeroBucket* k = &z->layout.buckets[b];
        if (k->layer == layer) { visit(k->offset, z->layout.bucket_packed[b], k->count / P, k->count % P); }
    }
    ncclCheck(ncclGroupEnd());
}

// the buckets that layer `layer`'s backward completed, reduce-scattered on
// z->stream behind the work queued so far (gpt_backward's grads_ready hook)
static void zero_grads_ready(void* ctx, int layer) {
    Zero* z = (Zero*)ctx;
    if (!z->reduce_in_backward) { return; }
    cudaCheck(cudaEventRecord(z->event, main_stream));
    cudaCheck(cudaStreamWaitEvent(z->stream, z->event, 0));
    const int P = z->proc.size, last = z->proc.rank == P - 1;
    zero_layer_buckets(z, layer, [&](size_t offset, size_t packed_at, size_t q, size_t rest) {
        float* mine = z->owned_grads + packed_at;
        if (q) { ncclCheck(ncclReduceScatter(z->grads + offset, mine, q, ncclFloat, ncclSum, z->comm, z->stream)); }
        // the last rank owns what does not divide by P; only it receives
        if (rest) {
            ncclCheck(ncclReduce(z->grads + offset + q * P, last ? mine + q : z->owned_grads, rest, ncclFloat, ncclSum,
                                 P - 1, z->comm, z->stream));
        }
    });
}

// the main stream waits for what the second stream has queued
static inline void zero_join(Zero* z) {
    cudaCheck(cudaEventRecord(z->event, z->stream));
    cudaCheck(cudaStreamWaitEvent(main_stream, z->event, 0));
}

static inline void zero_all_reduce_sum(Zero* z, float* x, size_t n) {
    ncclCheck(ncclAllReduce(x, x, n, ncclFloat, ncclSum, z->comm, main_stream));
}

// x[0] = the largest of every process's x[0], on the main stream: how the processes agree on a stop
static inline void zero_all_reduce_max(Zero* z, int* x) {
    ncclCheck(ncclAllReduce(x, x, 1, ncclInt32, ncclMax, z->comm, main_stream));
}

// full[flat] <- every rank's packed values of what it owns, for the buckets of `layer`
template <typename T>
static void zero_all_gather_layer(Zero* z, T* full, const T* packed, int layer, cudaStream_t stream) {
    ncclDataType_t type = sizeof(T) == 4 ? ncclFloat : ncclBfloat16;
    const int P = z->proc.size, last = z->proc.rank == P - 1;
    zero_layer_buckets(z, layer, [&](size_t offset, size_t packed_at, size_t q, size_t rest) {
        const T* mine = packed + packed_at;
        if (q) { ncclCheck(ncclAllGather(mine, full + offset, q, type, z->comm, stream)); }
        if (rest) {
            ncclCheck(ncclBroadcast(last ? mine + q : packed, full + offset + q * P, rest, type, P - 1, z->comm, stream));
        }
    });
}

// packed <- this process's share of full[flat], for the buckets of `layer`
// only (the inverse of zero_all_gather_layer; the rest of full may be scratch)
static void zero_take_layer(Zero* z, float* packed, const float* full, int layer) {
    for (int b = 0; b < z->layout.num_buckets; b++) {
        const ZeroBucket* k = &z->layout.buckets[b];
        if (k->layer != layer) { continue; }
        size_t start, len;
        zero_share(k->count, z->proc.size, z->proc.rank, &start, &len);
        if (len == 0) { continue; }
        cudaCheck(cudaMemcpyAsync(packed + z->layout.bucket_packed[b], full + k->offset + start, len * sizeof(float),
                                  cudaMemcpyDeviceToDevice, main_stream));
    }
}

// all of full[flat], on the main stream (checkpoints)
template <typename T>
void zero_all_gather(Zero* z, T* full, const T* packed) {
    zero_join(z);
    for (int layer = -1; layer < z->layout.num_layers; layer++) { zero_all_gather_layer(z, full, packed, layer, main_stream); }
}

// the new bf16 weights after the optimizer (queued on the main stream), on
// the second stream, the embedding first and then layer by layer
static inline void zero_all_gather_params(Zero* z, bf16* params, const bf16* packed) {
    cudaCheck(cudaEventRecord(z->event, main_stream));
    cudaCheck(cudaStreamWaitEvent(z->stream, z->event, 0));
    for (int layer = -1; layer < z->layout.num_layers; layer++) {
        zero_all_gather_layer(z, params, packed, layer, z->stream);
        cudaCheck(cudaEventRecord(z->gathered[layer + 1], z->stream));
    }
}

// the forward's params_needed hook: the main stream waits for layer's weights
// (a wait on an event not yet recorded, before the first step, is none)
static void zero_params_needed(void* ctx, int layer) {
    Zero* z = (Zero*)ctx;
    cudaCheck(cudaStreamWaitEvent(main_stream, z->gathered[layer + 1], 0));
}

// acc[i] = max over processes where is_max(i), else the sum (from sums)
__global__ void merge_stats_kernel(double* acc, const double* sums, int n, int max_first, int max_stride) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !(i >= max_first && (i - max_first) % max_stride == 0)) { acc[i] = sums[i]; }
}

// the step's statistics over all processes: acc (n doubles; the entries
// max_first, max_first + max_stride, ... are maxima, the rest sums), the
// units that fired anywhere and each unit's firing count (units of them),
// summed: every process chooses the layers' ELL widths and hot units from them
static inline void zero_reduce_stats(Zero* z, double* acc, int n, int max_first, int max_stride, uint8_t* fired,
                                     uint32_t* unit_count, size_t units) {
    if (n > z->stats_capacity) {
        cuda_free(z->stats_sum);
        z->stats_sum = (double*)cuda_malloc(n * sizeof(double));
        z->stats_capacity = n;
    }
    ncclCheck(ncclGroupStart());
    ncclCheck(ncclAllReduce(acc, z->stats_sum, n, ncclDouble, ncclSum, z->comm, main_stream));
    ncclCheck(ncclAllReduce(fired, fired, units, ncclUint8, ncclMax, z->comm, main_stream));
    ncclCheck(ncclAllReduce(unit_count, unit_count, units, ncclUint32, ncclSum, z->comm, main_stream));
    ncclCheck(ncclGroupEnd());
    ncclCheck(ncclAllReduce(acc, acc, n, ncclDouble, ncclMax, z->comm, main_stream));
    merge_stats_kernel<<<ceil_div(n, 256), 256, 0, main_stream>>>(acc, z->stats_sum, n, max_first, max_stride);
    cudaCheck(cudaGetLastError());
}

#endif // LLMC_ZERO_CUH
