# The two commands of the README:
#   make demo   install dependencies, build, run the remat tool's default demo
#   make test   install dependencies, build, run every test (what CI runs)
# Other targets: build, sanitize (ASan+UBSan test run), install-check, format, clean.

BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: setup build demo test unit-tests install-check sanitize format clean

setup:
	bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/tools/remat/remat train

unit-tests: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Installs into a scratch prefix and builds examples/ against it with find_package(remat).
install-check: build
	rm -rf $(BUILD)/install-check
	cmake --install $(BUILD) --prefix $(BUILD)/install-check/prefix
	cmake -S examples -B $(BUILD)/install-check/examples -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DCMAKE_PREFIX_PATH=$(CURDIR)/$(BUILD)/install-check/prefix
	cmake --build $(BUILD)/install-check/examples -j $(JOBS)
	$(BUILD)/install-check/examples/basic_checkpoint --steps 1

test: unit-tests install-check

sanitize: setup
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DREMAT_SANITIZE=ON -DREMAT_BUILD_BENCH=OFF
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan --output-on-failure -j $(JOBS)

format:
	git ls-files '*.h' '*.cpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-asan
