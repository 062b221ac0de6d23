# The two commands of the README:
#   make demo   install dependencies, build the remat tool, run its default demo
#   make test   install dependencies, build everything, run every test (what CI runs)
# The version matrix (Debian roots made by scripts/torch-env.sh; needs root):
#   make test-matrix        what CI runs after `make test`: test-sid and build-trixie-cuda
#   make test-sid           LibTorch 2.14.1 (Debian unstable), ASan+UBSan: build, test, install-check
#   make test-trixie        LibTorch 2.6.0 CPU (Debian 13): build, test, install-check
#   make build-trixie-cuda  LibTorch 2.6.0 CUDA 12.4: compile and link the library, tool, CUDA tests, examples
# Other targets: build, install-check, sanitize (ASan+UBSan test run on this machine's
#   LibTorch), format, clean,
#   bench (run every benchmark scenario, regenerate docs/benchmarks.md),
#   bench-sid (E3 on LibTorch and PyTorch 2.14: docs/benchmarks-libtorch-2.14.md).

BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
# Installs the Debian 12 packages; empty inside the version roots, which have theirs.
SETUP      ?= setup
# Flags for the executables of the examples built against the installed package.
EXAMPLES_CMAKE_ARGS ?=

.PHONY: setup configure build demo test unit-tests install-check install-check-build \
        test-matrix test-sid test-trixie build-trixie-cuda sanitize format clean bench bench-sid

setup:
	bash scripts/setup.sh

configure: $(SETUP)
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

# BUILD_TARGETS: the targets to build (empty: all of them).
BUILD_TARGETS ?=
build: configure
	cmake --build $(BUILD) -j $(JOBS) $(if $(BUILD_TARGETS),--target $(BUILD_TARGETS))

# Builds only what the demo runs: the planner, the runtime, the models and the tool.
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target remat_cli
	$(BUILD)/tools/remat/remat train

unit-tests: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Installs into a scratch prefix and builds examples/ against it with find_package(remat).
install-check-build: build
	rm -rf $(BUILD)/install-check
	cmake --install $(BUILD) --prefix $(BUILD)/install-check/prefix
	test -x $(BUILD)/install-check/prefix/bin/remat
	cmake -S examples -B $(BUILD)/install-check/examples -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DCMAKE_PREFIX_PATH=$(CURDIR)/$(BUILD)/install-check/prefix $(EXAMPLES_CMAKE_ARGS)
	cmake --build $(BUILD)/install-check/examples -j $(JOBS)

install-check: install-check-build
	$(BUILD)/install-check/examples/basic_checkpoint --steps 1
	$(BUILD)/install-check/examples/plan_a_chain > /dev/null
	$(BUILD)/install-check/examples/plan_a_transformer --steps 2 > /dev/null
	$(BUILD)/install-check/examples/dynamic_remat --steps 1 --width 64 --batch 32 --budget-mib 1 > /dev/null
	$(BUILD)/install-check/prefix/bin/remat --help > /dev/null

test: unit-tests install-check

# ---- the version matrix: the checkout copied into a Debian root and built there
test-matrix: test-sid build-trixie-cuda

# LibTorch 2.14 is built with AddressSanitizer + UBSan (the checks of `make sanitize`):
# one build in CI for both. Leak reports are off: LibTorch keeps its globals to exit.
test-sid:
	bash scripts/torch-env.sh sid run 'ASAN_OPTIONS=detect_leaks=0 make unit-tests install-check \
	  SETUP= BUILD=build-sid CMAKE_ARGS="$(SANITIZE_CMAKE_ARGS)" \
	  EXAMPLES_CMAKE_ARGS="$(SANITIZE_EXAMPLES_ARGS)"'

test-trixie:
	bash scripts/torch-env.sh trixie run 'make unit-tests install-check SETUP= BUILD=build-trixie'

# cuDNN cannot be installed from Debian's archive here (its package downloads it), so
# executables link with cuDNN's symbols unresolved; they cannot run without a GPU anyway.
# What is compiled and linked: the library, the tool, the CUDA tests and the examples,
# in the configuration of a machine without Gloo's headers (no remat::distributed),
# which CI checks only here. The CPU tests and the benchmarks are not compiled: the
# same sources build against 1.13 (`make test`) and 2.14 (`make test-sid`). Nothing
# built here runs, so it is compiled without optimisation (build type None: fastest).
CUDA_LINK = -DCMAKE_EXE_LINKER_FLAGS=-Wl,--unresolved-symbols=ignore-in-shared-libs
CUDA_CMAKE_ARGS = $(CUDA_LINK) -DREMAT_BUILD_DISTRIBUTED=OFF -DREMAT_BUILD_BENCH=OFF
build-trixie-cuda:
	bash scripts/torch-env.sh trixie-cuda run 'make install-check-build SETUP= \
	  BUILD=build-trixie-cuda BUILD_TYPE=None BUILD_TARGETS="remat_cli cuda_test" \
	  CMAKE_ARGS="$(CUDA_CMAKE_ARGS)" EXAMPLES_CMAKE_ARGS="$(CUDA_LINK)"'

# AddressSanitizer + UBSan over every test on this machine's LibTorch (-O1, line
# tables for the reports: REMAT_SANITIZE). CI runs the same checks on LibTorch 2.14
# (`make test-sid`), which is built sanitized for it.
SANITIZE_CMAKE_ARGS = -DREMAT_SANITIZE=ON -DREMAT_BUILD_BENCH=OFF
# Examples link to the sanitized libraries, so they take the sanitizers' runtime.
SANITIZE_EXAMPLES_ARGS = -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined
sanitize: $(SETUP)
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release $(SANITIZE_CMAKE_ARGS)
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan --output-on-failure -j $(JOBS)

# Installs the benchmark dependencies (the bench group: python3-torch for E6),
# builds remat_bench, runs every scenario at the sizes of BENCH_SCENARIOS and
# regenerates docs/benchmarks.md from the results (tables also as CSV and
# JSON in BENCH_OUT). About 40 minutes on 2 idle cores, plus up to 2 minutes
# per scenario waiting for the load the previous one left to settle.
BENCH_OUT       ?= $(BUILD)/bench-results
BENCH_SCENARIOS ?= E1 --batch 512 E2 E2-executor E2-variants E2-selective E3 E4 E5 E6 E7 E8
BENCH_PAGE      ?= docs/benchmarks.md
BENCH_PREAMBLE  ?= bench/benchmarks_preamble.md
bench:
	$(if $(SETUP),bash scripts/setup.sh bench)
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS) --target remat_bench
	rm -rf $(BENCH_OUT)
	$(BUILD)/bench/remat_bench --settle 120 --out $(BENCH_OUT) --page $(BENCH_PAGE) \
	  --preamble $(BENCH_PREAMBLE) $(BENCH_SCENARIOS)

# E3 on LibTorch 2.14 next to Python PyTorch 2.14 (whose selective
# checkpointing 1.13 lacks), in the Debian unstable root (needs root); writes
# docs/benchmarks-libtorch-2.14.md. About 15 minutes on 2 idle cores.
SID_PAGE = docs/benchmarks-libtorch-2.14.md
bench-sid:
	bash scripts/torch-env.sh sid run 'apt-get install -y -q --no-install-recommends python3-torch && \
	  make bench SETUP= BUILD=build-sid BENCH_SCENARIOS=E3 BENCH_PAGE=$(SID_PAGE) \
	  BENCH_PREAMBLE=bench/benchmarks_sid_preamble.md'
	cp "$$(bash scripts/torch-env.sh sid path)/work/remat/$(SID_PAGE)" $(SID_PAGE)

format:
	git ls-files '*.h' '*.cpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-asan build-sid build-trixie build-trixie-cuda
