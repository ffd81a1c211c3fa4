#!/usr/bin/env bash
# Plan B, on the GPU machine: if the bundle built here does not start there,
# build the same sources there (its image has nvcc, CMake, ninja and a C++
# compiler) without MPI (-DLOOM_MPI=OFF: parallel/comm/mpi_serial stands in
# for a world of one), against the libraries carried in the bundle's folder
# (tests/cuda/pack_build_deps.sh: Eigen, nlohmann/json, CLI11, GoogleTest,
# OpenBLAS). The single-GPU tests and `train_gpt --device cuda` need no MPI;
# the runner's multi-rank steps then say "not run (plan B: no MPI)".
#
#   bash tests/cuda/build_on_device.sh && UNPACKED=1 bash tests/cuda/gpu_runner.sh 1 2 5
#   (device tool: carry ["build-gpu-bundle"], as for the bundle)
#
# It lays the programs out as the bundle does (RUN_DIR/bin, flat), so
# gpu_runner.sh runs them unchanged. JOBS defaults to the machine's cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=${BUNDLE:-build-gpu-bundle}
build=${BUILD:-build-device}
run_dir=${RUN_DIR:-build-gpu-run}
deps=$PWD/build-gpu-deps
jobs=${JOBS:-$(nproc)}
t0=$SECONDS
[ -f "$bundle/loom-build-deps.tar.xz" ] || { echo "build_on_device.sh: no $bundle/loom-build-deps.tar.xz (build_bundle.sh makes it)" >&2; exit 2; }
rm -rf "$deps" && mkdir -p "$deps" && tar -C "$deps" -xJf "$bundle/loom-build-deps.tar.xz"
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc)
generator=(-G Ninja)
command -v ninja > /dev/null || generator=()

targets=(train_gpt bench_gpt_step bench_attention bench_row_kernels)
for src in tests/cuda/test_cuda_*.cpp; do
  name=$(basename "$src" .cpp)
  case $name in test_cuda_train_gpt_parallel | test_cuda_nccl_watchdog) continue ;; esac  # several ranks: mpiexec
  targets+=("$name")
done
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_MPI=OFF -DLOOM_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 -DLOOM_NATIVE=OFF -DLOOM_WASM=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_dnnl=ON -DCMAKE_PREFIX_PATH="$deps/usr" -DOPENBLAS_LIB="$deps/openblas/libopenblas.so.0" \
  -DCMAKE_CXX_FLAGS="-march=x86-64-v3 -isystem $deps/openblas" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath,$deps/openblas -Wl,-rpath-link,$deps/openblas" ${LOOM_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

# The bundle's layout (a flat bin/), for gpu_runner.sh with UNPACKED=1. The
# programs find OpenBLAS by their run path (build-gpu-deps/openblas).
rm -rf "${run_dir:?}" && mkdir -p "$run_dir/bin" "$run_dir/bench"
for t in "${targets[@]}"; do cp "$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)" "$run_dir/bin/"; done
echo "plan B: built on $(hostname) with -DLOOM_MPI=OFF, $jobs jobs, in $((SECONDS - t0)) s" | tee "$run_dir/BUNDLE.txt"
