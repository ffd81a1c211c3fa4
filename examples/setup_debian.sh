#!/usr/bin/env bash
# Installs what loom needs from Debian's archive (when missing), then
# configures and builds it in build/. Used by both README commands and by CI.
#   bash examples/setup_debian.sh             everything: libraries, programs, tests and benchmarks,
#                                             the CUDA path too when the toolkit is found (tests/run_all.sh, CI)
#   bash examples/setup_debian.sh train_gpt   that one target and the libraries it links (examples/train.sh):
#                                             a first build/ is configured without CUDA (LOOM_CMAKE_ARGS=
#                                             -DLOOM_CUDA=ON asks for it); an existing one keeps its choice
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-}

PACKAGES=(g++ cmake make libeigen3-dev libopenblas-dev nlohmann-json3-dev libdnnl-dev googletest libgtest-dev libgmock-dev libcli11-dev
          libopenmpi-dev openmpi-bin fortunes python3 python3-venv)  # python3: docs_check; python3-venv: the hf tests
bash examples/apt_install.sh "${PACKAGES[@]}"

# mpirun refuses to run as root unless told it is fine (CI and containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [ -n "$target" ]; then
  # One program, soon: nvcc compiling every kernel for a CPU run is most of a first build's time.
  first=()
  [ -f build/CMakeCache.txt ] || first=(-DLOOM_CUDA=OFF)
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${first[@]}" ${LOOM_CMAKE_ARGS:-}
  cmake --build build -j2 --target "$target"
else
  # -U: forget a LOOM_CUDA=OFF that a one-target build left, so the toolkit decides again.
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -U LOOM_CUDA ${LOOM_CMAKE_ARGS:-}
  cmake --build build -j2
fi
