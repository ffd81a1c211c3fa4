#!/usr/bin/env bash
# Installs what loom needs from Debian's archive (when missing), then
# configures and builds it in build/. Used by both README commands and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(g++ cmake make libeigen3-dev libopenblas-dev nlohmann-json3-dev libdnnl-dev googletest libgtest-dev libgmock-dev libcli11-dev
          libopenmpi-dev openmpi-bin fortunes python3 python3-venv)  # python3: docs_check; python3-venv: the hf tests
bash examples/apt_install.sh "${PACKAGES[@]}"

# mpirun refuses to run as root unless told it is fine (CI and containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${LOOM_CMAKE_ARGS:-}
cmake --build build -j2
