#!/usr/bin/env bash
# CTest install_find_package: installs the build tree into a prefix inside it,
# configures and builds tests/install (find_package(loom), loom::loom) against
# that prefix, runs the program and checks its matmul.
# Usage: check_install.sh <loom build dir> <C++ compiler> [compiler launcher]
set -euo pipefail
build=$1 cxx=$2 launcher=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$build/install_test
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work.log" 2>&1 || { cat "$work.log"; exit 1; }
test -f "$work/prefix/include/loom/tensor/tensor.h"
test -f "$work/prefix/lib/cmake/loom/loomConfig.cmake"
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_COMPILER="$cxx" \
      -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" -DCMAKE_BUILD_TYPE=Release > "$work.log" 2>&1 || { cat "$work.log"; exit 1; }
cmake --build "$work/build" > "$work.log" 2>&1 || { cat "$work.log"; exit 1; }
out=$("$work/build/consumer")
echo "consumer printed: $out"
[ "$out" = "19 22 43 50 " ] || { echo "expected: 19 22 43 50"; exit 1; }
