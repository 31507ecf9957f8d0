/*
 A kernel tracer for any of our binaries, for machines without Nsight Systems:
 a CUPTI injection library. The CUDA driver loads it when CUDA_INJECTION64_PATH
 names it; it records every kernel's start and end on the GPU (kernels inside
 CUDA graphs too, one record per node) and at exit writes them as CSV
 (start_ns, end_ns, stream, graph, name) and prints the kernels that took the
 most time, with the GPU's idle time between kernels:

     CUDA_INJECTION64_PATH=build/dev/libkernel_trace.so KERNEL_TRACE_CSV=trace.csv \
         build/dev/bench_infer --preset 1.5b --batch 1

 Times are the GPU's own timestamps; what the tracer costs is on the host side
 (a buffer callback now and then), not inside the kernels.
*/
#include <cupti.h>
#include <cxxabi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#define CUPTI_CHECK(call)                                                                              \
    do {                                                                                               \
        CUptiResult r_ = (call);                                                                       \
        if (r_ != CUPTI_SUCCESS) {                                                                     \
            const char* msg_;                                                                          \
            cuptiGetResultString(r_, &msg_);                                                           \
            fprintf(stderr, "kernel_trace: %s failed: %s\n", #call, msg_);                            \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

struct KernelRecord {
    uint64_t start, end;
    uint32_t stream, graph;
    std::string name;
};

static std::vector<KernelRecord> records;
static const size_t BUFFER_BYTES = 8 << 20;

static std::string demangle(const char* name) {
    int status = 0;
    char* d = abi::__cxa_demangle(name, NULL, NULL, &status);
    std::string s = status == 0 && d ? d : name;
    free(d);
    // templates and argument lists make names long; the kernel and its template arguments are enough
    size_t paren = s.find('(');
    if (paren != std::string::npos) { s.resize(paren); }
    std::replace(s.begin(), s.end(), ',', ';');
    return s;
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = (uint8_t*)aligned_alloc(8, BUFFER_BYTES);
    if (*buffer == NULL) { fprintf(stderr, "kernel_trace: out of host memory\n"); exit(1); }
    *size = BUFFER_BYTES;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) { continue; }
        const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)record;
        records.push_back({k->start, k->end, k->streamId, k->graphId, demangle(k->name)});
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
    if (dropped) { fprintf(stderr, "kernel_trace: CUPTI dropped %zu records\n", dropped); }
    free(buffer);
}

static void write_report(void) {
    cuptiActivityFlushAll(1);
    if (records.empty()) { fprintf(stderr, "kernel_trace: no kernels ran\n"); return; }
    std::sort(records.begin(), records.end(), [](const KernelRecord& a, const KernelRecord& b) { return a.start < b.start; });
    const char* path = getenv("KERNEL_TRACE_CSV");
    if (path) {
        FILE* f = fopen(path, "w");
        if (f == NULL) { fprintf(stderr, "kernel_trace: cannot write %s\n", path); exit(1); }
        fprintf(f, "start_ns,end_ns,stream,graph,name\n");
        for (const KernelRecord& r : records) {
            fprintf(f, "%llu,%llu,%u,%u,%s\n", (unsigned long long)r.start, (unsigned long long)r.end, r.stream, r.graph,
                    r.name.c_str());
        }
        if (fclose(f) != 0) { fprintf(stderr, "kernel_trace: writing %s failed\n", path); exit(1); }
    }
    // busy time: the union of kernel intervals (kernels on several streams overlap)
    uint64_t busy = 0, covered_to = records[0].start;
    std::map<std::string, std::pair<int, uint64_t>> by_name;
    for (const KernelRecord& r : records) {
        uint64_t from = std::max(r.start, covered_to);
        if (r.end > from) { busy += r.end - from; covered_to = r.end; }
        auto& e = by_name[r.name];
        e.first++;
        e.second += r.end - r.start;
    }
    uint64_t span = covered_to - records[0].start;
    std::vector<std::pair<std::string, std::pair<int, uint64_t>>> rows(by_name.begin(), by_name.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
    fprintf(stderr, "kernel_trace: %zu kernels over %.3f ms, GPU busy %.3f ms (%.1f%%)\n", records.size(), span * 1e-6,
            busy * 1e-6, 100.0 * busy / span);
    fprintf(stderr, "%10s %8s %10s  %s\n", "total ms", "count", "mean us", "kernel");
    for (size_t i = 0; i < rows.size() && i < 40; i++) {
        fprintf(stderr, "%10.3f %8d %10.2f  %.110s\n", rows[i].second.second * 1e-6, rows[i].second.first,
                rows[i].second.second * 1e-3 / rows[i].second.first, rows[i].first.c_str());
    }
}

extern "C" int InitializeInjection(void) {
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    atexit(write_report);
    return 1;
}
