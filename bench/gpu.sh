#!/usr/bin/env bash
# gpu.sh OUTDIR — remat on a CUDA machine, in one run of at most about 8 minutes:
# builds remat against the machine's PyTorch LibTorch, runs the CUDA tests,
# benchmark E6's remat side (remat_bench E6 --device cuda: no checkpointing,
# per-block and sequential checkpointing in both modes, a planned row) at a size
# that fills a large GPU, then as much of the CPU test suite as the remaining
# time allows; writes logs and tables into OUTDIR.
#
# For a machine with CUDA, nvcc, CMake and a Python PyTorch 2.x with CUDA, but no
# package manager and no network. LibTorch comes from
#   python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'
# (else from the default CMake search). GoogleTest, CLI11 and nlohmann-json come
# from a bundle made beforehand on a Debian machine by scripts/gpu-bundle.sh
# (default .gpu-deps in the checkout, or REMAT_GPU_DEPS) when the machine lacks them.
#
# On a machine without a GPU it builds and tests as far as it can and says what it
# skipped (OUTDIR/summary.txt). Exit status: 0 when everything that ran passed.
#
# Environment: REMAT_GPU_BUILD (build folder, default /tmp/remat-gpu-build),
# REMAT_GPU_DEPS (the bundle), REMAT_GPU_SECONDS (time budget, default 480).
set -uo pipefail

[ $# -eq 1 ] || {
  echo "usage: bench/gpu.sh OUTDIR" >&2
  exit 2
}
out=$1
mkdir -p "$out"
out=$(cd "$out" && pwd)
checkout=$(cd "$(dirname "$0")/.." && pwd)
build=${REMAT_GPU_BUILD:-/tmp/remat-gpu-build}
deps=${REMAT_GPU_DEPS:-$checkout/.gpu-deps}
budget_s=${REMAT_GPU_SECONDS:-480}
start_s=$(date +%s)
jobs=$(nproc)
summary="$out/summary.txt"
: > "$summary"
failed=0

note() { echo "gpu.sh: $*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start_s)); }
left() { echo $((budget_s - $(elapsed))); }

# ---- 1. the machine
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu: /' || echo "gpu: nvidia-smi not found"
  python3 -c 'import torch; print("python torch:", torch.__version__, "cuda", torch.version.cuda,
"gpu available:", torch.cuda.is_available())' 2>/dev/null || echo "python torch: none"
  echo "commit: $(git -C "$checkout" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$out/machine.txt"
cat "$out/machine.txt" | tee -a "$summary"
has_gpu=0
python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && has_gpu=1

# ---- 2. dependencies
prefixes=()
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
if [ -n "$torch_prefix" ]; then
  prefixes+=("$torch_prefix")
else
  note "no Python PyTorch: LibTorch from the default CMake search"
fi
if [ -d "$deps/usr/share/cmake" ]; then
  prefixes+=("$deps/usr")
fi
if [ -d "$deps/usr/src/googletest" ] && [ ! -f /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake ] &&
  [ ! -f /usr/local/lib/cmake/GTest/GTestConfig.cmake ]; then
  note "building GoogleTest from the bundle"
  if cmake -S "$deps/usr/src/googletest" -B "$build/gtest" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$build/gtest-prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    > "$out/deps.log" 2>&1 && cmake --build "$build/gtest" -j "$jobs" >> "$out/deps.log" 2>&1 &&
    cmake --install "$build/gtest" >> "$out/deps.log" 2>&1; then
    prefixes+=("$build/gtest-prefix")
  else
    note "GoogleTest did not build (deps.log)"
  fi
fi
prefix_path=$(IFS=';' && echo "${prefixes[*]}")

# ---- 3. build
note "configure and build with $jobs jobs (build.log)"
if ! { cmake -S "$checkout" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix_path" &&
  cmake --build "$build" -j "$jobs"; } > "$out/build.log" 2>&1; then
  note "FAILED: the build (last lines of build.log follow)"
  tail -n 30 "$out/build.log" | tee -a "$summary"
  exit 1
fi
note "built in $(elapsed) s; $(grep -m1 'builds with C++' "$out/build.log" | sed 's/^-- //')"

# ---- 4. CUDA tests
ctest --test-dir "$build" -R '^cuda_test$' -V --timeout 300 > "$out/cuda_test.log" 2>&1
if grep -q "no CUDA GPU is visible" "$out/cuda_test.log"; then
  note "skipped: the CUDA tests ($(grep -c '^.*skipped (no CUDA GPU)' "$out/cuda_test.log") tests; no GPU visible)"
elif grep -q "tests passed" "$out/cuda_test.log" && ! grep -q "FAILED" "$out/cuda_test.log"; then
  note "passed: the CUDA tests ($(grep -o '\[  PASSED  \] [0-9]* tests' "$out/cuda_test.log"))"
else
  note "FAILED: the CUDA tests (cuda_test.log)"
  failed=1
fi
grep "^\[ cuda     \]" "$out/cuda_test.log" | sed 's/^/  /' | tee -a "$summary"

# ---- 5. GPU benchmark
if [ "$has_gpu" = 1 ]; then
  # 24 blocks of 2048 -> 8192 -> 2048 at batch 16384: about 40 GB of activations.
  # E6's PyTorch column is CPU-only; on a GPU the section says so.
  note "remat_bench E6 on cuda (e6_cuda.md; tables in e6_cuda/)"
  if timeout $(($(left) > 60 ? $(left) - 30 : 30)) "$build/bench/remat_bench" --device cuda \
    --threads 4 --out "$out/e6_cuda" E6 --blocks 24 --dim 2048 --hidden 8192 --batch 16384 \
    > "$out/e6_cuda.md" 2>&1; then
    tee -a "$summary" < "$out/e6_cuda.md"
  else
    note "FAILED or timed out: remat_bench E6 on cuda"
    failed=1
  fi
else
  note "skipped: the GPU benchmark (no GPU visible)"
fi

# ---- 6. the CPU suite, in the time left
if [ "$(left)" -gt 60 ]; then
  note "CPU tests with $(left) s left (ctest.log)"
  if timeout "$(left)" ctest --test-dir "$build" -E '^cuda_test$' -j "$((jobs / 2 > 1 ? jobs / 2 : 1))" \
    --output-on-failure > "$out/ctest.log" 2>&1; then
    note "passed: $(grep 'tests passed' "$out/ctest.log")"
  else
    note "FAILED or cut short: the CPU tests ($(grep 'tests passed' "$out/ctest.log" || echo 'no summary'))"
    failed=1
  fi
else
  note "skipped: the CPU tests (no time left)"
fi
note "done in $(elapsed) s"
exit $failed
