# Build: `make` (train_gpt_sparse, infer, tokenize, hf_convert, analyze), `make test` (everything that
# needs no GPU), `make test-gpu` (on a machine with an NVIDIA GPU), `make fuzz`
# (the parsers under libFuzzer; needs clang).

NVCC ?= nvcc
CXX ?= g++
# the CPU path is OpenMP; -march=native because the binary runs where it is built
HOST_FLAGS = -O3 -march=native -fopenmp -Wall -Wextra -Wno-unused-parameter
# sm_90a for the Hopper kernels, sm_80 as the portable path
GPU_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
NVCC_FLAGS = -O3 -std=c++17 -I. $(GPU_ARCH) -Xcompiler "$(HOST_FLAGS)" -lineinfo
NVCC_LIBS = -lgomp -lcublasLt -lcublas -lnccl
# data-parallel processes meet through MPI when an MPI is installed (else TCP or a file)
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
ifneq ($(MPI_CFLAGS),)
# (C API only: the MPI C++ bindings' headers are not -Wall clean)
NVCC_FLAGS += -DUSE_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX $(MPI_CFLAGS)
NVCC_LIBS += $(shell mpicc --showme:link 2>/dev/null)
endif

# The inference server (infer --serve) needs libmicrohttpd: the system's (pkg-config), else the copy that
# dev/carry_microhttpd.sh unpacks into .deps/ (a machine without a package manager; the rpath finds it at run
# time). Without either, infer builds without the server and --serve says what to install.
PKG_CONFIG ?= pkg-config
MHD_LIBS := $(shell $(PKG_CONFIG) --libs libmicrohttpd 2>/dev/null)
MHD_CFLAGS := $(shell $(PKG_CONFIG) --cflags libmicrohttpd 2>/dev/null)
MHD_DEPS_LIB := $(patsubst %/libmicrohttpd.so,%,$(firstword $(wildcard $(CURDIR)/.deps/usr/lib/*/libmicrohttpd.so)))
ifeq ($(MHD_LIBS),)
ifneq ($(MHD_DEPS_LIB),)
MHD_CFLAGS := -I$(CURDIR)/.deps/usr/include
MHD_LIBS := -L$(MHD_DEPS_LIB) -lmicrohttpd -Xlinker --disable-new-dtags,-rpath,$(MHD_DEPS_LIB)
endif
endif
SERVE_FLAGS := $(if $(MHD_LIBS),-DUSE_MICROHTTPD $(MHD_CFLAGS))

# tests are plain C++ over the same headers, also built with the sanitizers
TEST_FLAGS = -O2 -g -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-parameter -I.
SAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

HEADERS = $(wildcard llmc/*.h llmc/ffn/*.h llmc/serve/*.h)
BINARIES = train_gpt_sparse infer tokenize hf_convert analyze
CPU_TESTS = $(patsubst test/%.cpp,build/%,$(wildcard test/test_*.cpp))
SAN_TESTS = $(patsubst build/%,build/san/%,$(CPU_TESTS))
SCRIPT_TESTS = $(wildcard test/test_*.sh)
CUDA_HEADERS = $(wildcard llmc/*.cuh llmc/ffn/*.cuh)
GPU_TESTS = $(patsubst test/gpu/%.cu,build/gpu/%,$(wildcard test/gpu/test_*.cu))
DEV_TOOLS = $(patsubst dev/%.cu,build/dev/%,$(wildcard dev/*.cu))

all: $(BINARIES)

train_gpt_sparse: train_gpt_sparse.cu $(HEADERS) $(CUDA_HEADERS)
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(NVCC_LIBS)

infer: infer.cu $(HEADERS) $(CUDA_HEADERS)
	$(NVCC) $(NVCC_FLAGS) $(SERVE_FLAGS) $< -o $@ $(NVCC_LIBS) $(MHD_LIBS)

# the tools that ship beside the two binaries (tools/; dev/ holds benchmarks and development aids)
tokenize: tools/tokenize.cpp $(HEADERS)
	$(CXX) -std=c++17 -I. $(HOST_FLAGS) $< -o $@

hf_convert: tools/hf_convert.cpp $(HEADERS)
	$(CXX) -std=c++17 -I. $(HOST_FLAGS) $< -o $@

analyze: tools/analyze.cpp $(HEADERS)
	$(CXX) -std=c++17 -I. $(HOST_FLAGS) $< -o $@

# the converter's test includes its source
build/test_hf_convert build/san/test_hf_convert: tools/hf_convert.cpp
# the screened gate's CPU and GPU tests share their adversarial rows
build/test_screened_gate build/san/test_screened_gate build/gpu/test_screened_gate: test/screened_gate_rows.h

build/test_%: test/test_%.cpp test/test.h $(HEADERS)
	@mkdir -p build
	$(CXX) $(TEST_FLAGS) $< -o $@ -lm

build/san/test_%: test/test_%.cpp test/test.h $(HEADERS)
	@mkdir -p build/san
	$(CXX) $(TEST_FLAGS) $(SAN_FLAGS) $< -o $@ -lm

# Fuzzing: a libFuzzer harness (fuzz/fuzz_NAME.cpp) per parser, built with clang, ASan and UBSan.
# `make fuzz` runs each for FUZZ_SECONDS (`make fuzz FUZZ_SECONDS=600`) with a random seed (or
# FUZZ_SEED) from the seeds that build/fuzz_seeds writes and fuzz/regressions/, a search for people;
# `make fuzz-ci` runs each for FUZZ_RUNS inputs from seed 1, which repeats itself (fuzz/run.sh), for
# CI, built without the stack-depth feature (how deep a call went shifts with where ASLR puts the
# stack, and the fuzzer would keep different inputs from run to run); FUZZ_JOBS harnesses at a time.
# `make test` replays the seeds and fuzz/regressions/ through the same harnesses built with g++ and
# the sanitizers (defined before `test`, whose prerequisites make expands where it reads them).
FUZZ_CXX ?= clang++
FUZZ_SECONDS ?= 60
FUZZ_SEED ?= 0
FUZZ_RUNS ?= 100000
FUZZ_JOBS ?= 1
FUZZ_FLAGS = -g -O1 -std=c++17 -I. -Wall -Wextra -Wno-unused-parameter -fsanitize=fuzzer,address,undefined \
             -fno-sanitize-recover=all
FUZZ_NAMES = $(patsubst fuzz/fuzz_%.cpp,%,$(wildcard fuzz/fuzz_*.cpp))
FUZZ_REPLAYS = $(patsubst %,build/san/fuzz_%,$(FUZZ_NAMES))
FUZZ_DEPS = fuzz/fuzz.h fuzz/common.h $(HEADERS)

test: $(BINARIES) $(CPU_TESTS) $(SAN_TESTS) $(FUZZ_REPLAYS) build/fuzz/seeds/.done
	@bash test/run_tests.sh $(CPU_TESTS) $(SAN_TESTS) $(FUZZ_REPLAYS) $(SCRIPT_TESTS)

build/fuzz/fuzz_%: fuzz/fuzz_%.cpp $(FUZZ_DEPS)
	@mkdir -p build/fuzz
	$(FUZZ_CXX) $(FUZZ_FLAGS) $< -o $@

build/fuzz-ci/fuzz_%: fuzz/fuzz_%.cpp $(FUZZ_DEPS)
	@mkdir -p build/fuzz-ci
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fno-sanitize-coverage=stack-depth $< -o $@

build/san/fuzz_%: fuzz/fuzz_%.cpp $(FUZZ_DEPS)
	@mkdir -p build/san
	$(CXX) $(TEST_FLAGS) $(SAN_FLAGS) -DFUZZ_REPLAY -DFUZZ_TARGET='"$*"' $< -o $@ -lm

build/fuzz/seeds/.done: fuzz/seeds.cpp $(FUZZ_DEPS) test/data/tokenizer_vectors.txt test/data/eval/hellaswag_fixture.bin
	@mkdir -p build/fuzz
	$(CXX) $(TEST_FLAGS) $< -o build/fuzz/seeds_gen -lm
	rm -rf build/fuzz/seeds && build/fuzz/seeds_gen && touch $@

fuzz: $(patsubst %,build/fuzz/fuzz_%,$(FUZZ_NAMES)) build/fuzz/seeds/.done
	@bash fuzz/run.sh -j $(FUZZ_JOBS) -t $(FUZZ_SECONDS) -s $(FUZZ_SEED) $(FUZZ_NAMES)

fuzz-ci: $(patsubst %,build/fuzz-ci/fuzz_%,$(FUZZ_NAMES)) build/fuzz/seeds/.done
	@bash fuzz/run.sh -j $(FUZZ_JOBS) -n $(FUZZ_RUNS) -s 1 $(FUZZ_NAMES)

# GPU tests, benchmarks and dev tools: built anywhere, run on a machine with a GPU
build/gpu/test_%: test/gpu/test_%.cu test/test.h $(HEADERS) $(CUDA_HEADERS)
	@mkdir -p build/gpu
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(NVCC_LIBS)

build/dev/%: dev/%.cu $(HEADERS) $(CUDA_HEADERS)
	@mkdir -p build/dev
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(NVCC_LIBS)

# the CUPTI kernel tracer (dev/kernel_trace.cpp), loaded through CUDA_INJECTION64_PATH
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC)))
build/dev/libkernel_trace.so: dev/kernel_trace.cpp
	@mkdir -p build/dev
	$(CXX) -std=c++17 -O2 -Wall -Wextra -shared -fPIC -I$(CUDA_HOME)/include $< -o $@ -L$(CUDA_HOME)/lib64 -lcupti

gpu: $(BINARIES) $(GPU_TESTS) $(DEV_TOOLS) build/dev/libkernel_trace.so

test-gpu: $(BINARIES) $(GPU_TESTS) build/dev/bench_infer
	@bash test/run_tests.sh $(GPU_TESTS) $(wildcard test/gpu/test_*.sh)

clean:
	rm -rf build $(BINARIES)

.PHONY: all test test-gpu gpu clean fuzz fuzz-ci
