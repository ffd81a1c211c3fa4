#!/usr/bin/env bash
# Builds, on this machine (nvcc is here; nothing is compiled on the GPU
# machine), every program a GPU session runs, and packs them for the device
# tool to carry: build-gpu-bundle/loom-gpu-bundle.tar.xz (ignored by git,
# `carry: ["build-gpu-bundle"]`). tests/cuda/gpu_runner.sh unpacks and runs it.
#
#   nice -n 10 bash tests/cuda/build_bundle.sh            # about 25 MB packed (Open MPI and OpenBLAS inside)
#   FMAD=OFF nice -n 10 bash tests/cuda/build_bundle.sh   # kernels without FMA contraction (--fmad=false)
#
# Built for the H100 alone (sm_90), with portable host code (x86-64-v3, no
# -march=native: the GPU machine's CPU is not this one) and without oneDNN
# (its image has no libdnnl.so.2). The GPU machine's image is not known to
# hold Open MPI, mpirun or OpenBLAS, so the bundle carries them
# (tests/cuda/bundle_runtime.sh: every library but glibc's, the driver's and
# CUDA's, Open MPI's launcher, plugins and help texts, with $ORIGIN run
# paths); tests/cuda/rehearse_bare.sh proves it in a bare Debian here.
# The build folder (build-gpu/) is kept, so a fix rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build-gpu}
out="build-gpu-bundle"
jobs=${JOBS:-2}
t0=$SECONDS

# The programs: every CUDA test, what those tests launch, and the GPU runs.
targets=(train_gpt bench_gpt_step bench_allreduce bench_attention nccl_watchdog_job mpi_cuda_collectives mpi_cuda_nccl)
targets+=(bench_row_kernels)  # the fast vs reference row kernels (bench/row_kernels.cpp)
for src in tests/cuda/test_cuda_*.cpp; do targets+=("$(basename "$src" .cpp)"); done

mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLOOM_CUDA_FMAD="${FMAD:-ON}" -DLOOM_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3" \
  -DCMAKE_DISABLE_FIND_PACKAGE_dnnl=ON > "$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

# Flat: the tests find train_gpt and nccl_watchdog_job beside themselves
# (tests/run_command.h, program_path).
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$out"
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)
  [ -n "$f" ] || { echo "build_bundle.sh: $t was not built" >&2; exit 1; }
  strip -o "$stage/bin/$t" "$f"
done
bash tests/cuda/bundle_runtime.sh "$stage" | tee "$stage/RUNTIME.txt"
# Plan B's luggage beside the bundle (tests/cuda/build_on_device.sh).
bash tests/cuda/pack_build_deps.sh "$out/loom-build-deps.tar.xz" "$stage/lib"
{
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!build*' || echo ' (+ uncommitted changes)')"
  echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -n 1)"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1 || /usr/local/cuda/bin/nvcc --version | tail -n 1)"
  echo "flags: sm_90, -march=x86-64-v3, no oneDNN, LOOM_CUDA_FMAD=${FMAD:-ON}"
  echo "needs from the machine: $(bash tests/cuda/bundle_ldd_check.sh "$stage" --cuda | sed 's/ -> [^,]*//g'), glibc, libcuda"
  cat "$stage/RUNTIME.txt"
} > "$stage/BUNDLE.txt"
rm "$stage/RUNTIME.txt"
tar -C "$stage" -cJf "$out/loom-gpu-bundle.tar.xz.tmp" bin lib share etc env.sh BUNDLE.txt
mv "$out/loom-gpu-bundle.tar.xz.tmp" "$out/loom-gpu-bundle.tar.xz"
cat "$stage/BUNDLE.txt"
echo "bundle: $out/loom-gpu-bundle.tar.xz, $(du -k "$out/loom-gpu-bundle.tar.xz" | cut -f1) KiB packed," \
  "$(du -sk "$stage" | cut -f1) KiB unpacked, built in $((SECONDS - t0)) s"
