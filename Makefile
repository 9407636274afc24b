# fsdpq's front door. `make run` and `make test` do all the set-up on a fresh Debian 12 machine.
BUILD_DIR   ?= build
BUILD_TYPE  ?= Release
CMAKE_FLAGS ?=
JOBS        ?= $(shell nproc)
CTEST_FLAGS ?=

# Open MPI refuses root unless told; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT = 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM = 1

.PHONY: all deps configure build test run clean help

all: build

help:
	@echo "make deps | make (build) | make test | make run | make sanitize | make clean"

deps:
	@bash scripts/install-deps.sh

$(BUILD_DIR)/build.ninja: CMakeLists.txt | deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) > $(BUILD_DIR).cmake.log 2>&1 \
	  || { cat $(BUILD_DIR).cmake.log; exit 1; }

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

# The embedded demo: a tiny model, a tokenizer and data the program makes itself.
run: build
	./fsdpq demo

# The side-by-side benchmark, a GPU-machine command (bench/README.md: what to carry, how to read it):
# fsdpq (the built binary) and every peer, ctx 512 and 2048, bs 1, 2, 4 ... until out of memory.
#   make bench BENCH_OUT=$$OUT BENCH_ARGS="--quick"
BENCH_OUT   ?= bench
BENCH_ARGS  ?=
BENCH_FSDPQ ?= $(BUILD_DIR)/fsdpq
.PHONY: bench
bench:
	python3 bench/bench.py --fsdpq $(BENCH_FSDPQ) --peers hf_lora_eager,hf_lora_compile,hf_qlora_bnb,fsdpq_lora,fsdpq_qlora \
	  --results $(BENCH_OUT)/results.jsonl --log $(BENCH_OUT)/bench.log $(BENCH_ARGS)
	python3 bench/compare.py $(BENCH_OUT)/results.jsonl | tee $(BENCH_OUT)/table.md


# The CPU suite under AddressSanitizer and UndefinedBehaviorSanitizer (no CUDA: the GPU suite has its
# own device runs), any report fatal. Left out: the three tests that measure or limit host memory
# (ulimit -v, a 256 TiB request, resident-set thresholds), which the sanitizers' shadow memory and
# quarantine change; leak reports are off (Open MPI's own allocations would drown them).
SANITIZE_DIR ?= build-sanitize
.PHONY: sanitize
sanitize: deps
	@cmake -S . -B $(SANITIZE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDPQ_WITH_CUDA=OFF $(CMAKE_FLAGS) \
	  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > $(SANITIZE_DIR).cmake.log 2>&1 \
	  || { cat $(SANITIZE_DIR).cmake.log; exit 1; }
	@cmake --build $(SANITIZE_DIR) -j $(JOBS)
	@cd $(SANITIZE_DIR) && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure \
	  -j $(JOBS) --timeout 1800 -E "Cli.RunningOutOfHostMemoryIsAUserError|HostOutOfMemory.|FsdpTrain.PeakHostMemoryPerRank" \
	  $(CTEST_FLAGS)

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR).cmake.log fsdpq
