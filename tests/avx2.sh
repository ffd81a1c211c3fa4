#!/usr/bin/env bash
# CI's clang-avx2 stage: the second compiler and the other instruction set in
# one build. The normal build is GCC at -march=native; CI's machine is an
# AVX-512 one some days and an AVX2-only one (AMD Zen 3) on others, and loom's
# kernels differ between them (row_sum's 16 lanes are one register or two;
# oneDNN picks its GEMMs, and whether bf16 ones are native, at run time). So
# that a submission made on one kind passes on the other, this
#   compiles every C++ file with clang for x86-64-v3 (AVX2 + FMA: every x86-64
#     CPU of the last ten years), warnings as errors: a missing #include or a
#     GCC-only construct fails here, not on a user's machine. The library,
#     what runs below (the kernels' tests, the programs docs_check runs) and
#     the benchmarks (their vector code could change the ABI without AVX-512:
#     -Wpsabi, a warning of clang's code generator) are built and linked at
#     -O1; every other file (the other tests, the CUDA tests' host code) goes
#     through clang's front end only (tests/syntax_check.py: -fsyntax-only
#     with the same flags, so every front-end warning), which saves their
#     code generation and links (issue 51: CI's cold time);
#   runs, with oneDNN held to AVX2 as well,
#     the kernels' tests   every op and its gradient, the row kernels and
#                          their fast paths, attention, bf16 GEMMs (their fp32
#                          path), the GPT and Llama against PyTorch's numbers
#     docs_check           the chapters' quoted numbers within their stated
#                          tolerance, and the rows quoted for CPUs without
#                          native bf16 GEMMs
#     a training parity    data parallel and ZeRO-1 against one process
# Not the whole suite again (CI's time: the normal build runs all of it).
# -O1: the tests run at a speed near -O3's, and the kernel files compile in a
# fraction of -O3's time; the tests' own files at the library's -O1
# (LOOM_TESTS_OPT empty), as this stage has always built them.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# clang (Debian's clang 14) and its OpenMP runtime, when missing.
bash examples/apt_install.sh clang libomp-dev
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# One CUDA architecture: the normal build's (nvcc compiles those files, with its own host compiler).
# The compile commands and the file API's codemodel (targets and what they depend on): tests/syntax_check.py.
mkdir -p build-clang/.cmake/api/v1/query
touch build-clang/.cmake/api/v1/query/codemodel-v2
CC=clang CXX=clang++ cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DLOOM_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3" -DCMAKE_CUDA_ARCHITECTURES=90 -DLOOM_WERROR=ON -DLOOM_WASM=OFF \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DLOOM_TESTS_OPT= "${launcher[@]}" > /dev/null

tests=(test_tensor test_tensor_ops test_autograd test_nn test_fast_row_math test_fast_paths test_gemm_bf16 test_attention
       test_flash_attention test_llama_ops test_dropout test_optim test_mixed_precision test_gpt_reference test_small_gemm
       test_llama_reference test_causal_softmax_rows test_gelu_vec test_train_gpt_parallel)
# What docs_check runs (the chapters' ```sh check blocks: train_gpt, loom_plan, autograd_demo and three
# benchmarks), and every benchmark.
programs=(train_gpt loom_plan autograd_demo)
for src in bench/*.cpp; do programs+=("bench_$(basename "$src" .cpp)"); done
cmake --build build-clang -j2 --target "${tests[@]}" "${programs[@]}"
python3 tests/syntax_check.py build-clang "${tests[@]}" "${programs[@]}"
echo "avx2: clang build clean at -march=x86-64-v3 (warnings are errors): what runs here built, the rest through the front end"
export ONEDNN_MAX_CPU_ISA=AVX2
echo "avx2: running the kernels' tests, docs_check and a parity at x86-64-v3, ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA"
failed=()
for t in "${tests[@]}"; do
  filter='*'
  [ "$t" = test_train_gpt_parallel ] &&
    filter='TrainGptParallel.BucketDataParallelTwoRanksMatchesOneProcess:TrainGptParallel.ZeroTwoRanksMatchesOneProcess'
  echo "avx2: $t ($filter)"
  build-clang/tests/$t --gtest_brief=1 --gtest_filter="$filter" || failed+=("$t")
done
ctest --test-dir build-clang --output-on-failure -R '^docs_check$' || failed+=(docs_check)
if [ ${#failed[@]} -gt 0 ]; then
  echo "avx2: FAILED at x86-64-v3 with oneDNN held to AVX2: ${failed[*]}" >&2
  exit 1
fi
echo "avx2: ${#tests[@]} test binaries and docs_check passed at x86-64-v3 with oneDNN held to AVX2"
