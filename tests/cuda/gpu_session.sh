#!/usr/bin/env bash
# What a session lent the GPU machine (DEVELOPERS.md, the device tool) runs
# first: build loom with CUDA for the H100 (sm_90), run every `cuda` test,
# train on the GPU, and take the GPU benchmarks, each step's log written under
# $OUT (the device tool's folder that comes back; out/gpu when unset).
#
#   bash tests/cuda/gpu_session.sh build test      # first call: build, then ctest -L cuda
#   bash tests/cuda/gpu_session.sh train bench     # second call, on the warm machine
#   bash tests/cuda/gpu_session.sh                 # all four (may not fit one 10-minute call)
#   bash tests/cuda/gpu_session.sh cpu             # the CPU suite there too (no fortunes: one test fails)
#
# Every step runs even when one before it failed, and summary.txt lists each
# step's exit status and seconds, so a failing test does not hide the
# benchmark's numbers. At most 8 files come back from $OUT; this writes 7:
# summary.txt and build, ctest_cuda (+ .xml), train, gpt_step, allreduce logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-out/gpu}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=build-gpu
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build test train bench)

# run_step NAME SECONDS CMD...: CMD's output to NAME.log, at most SECONDS long.
run_step() {
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: rc $rc, $((SECONDS - t0)) s$([ $rc = 124 ] && echo " (timed out)")" | tee -a "$out/summary.txt"
}

for s in "${steps[@]}"; do
  case $s in
    build)
      run_step build 420 bash -c "nvidia-smi && cmake -S . -B $B -G Ninja -DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        && cmake --build $B -j16" ;;
    test)  # one GPU: the multi-rank tests share it over --backend mpi; the NCCL ones skip (they need 2)
      run_step ctest_cuda 480 ctest --test-dir "$B" -L cuda --output-on-failure --timeout 300 \
        --output-junit "$out/ctest_cuda.xml" ;;
    cpu)
      run_step ctest_cpu 420 ctest --test-dir "$B" -LE cuda -j16 --timeout 300 ;;
    train)  # the main job on the GPU, then the same 60 steps on the CPU: the losses should agree (TF32 off)
      run_step train 300 bash -c "rc=0; for d in cuda cpu; do echo \"== --device \$d\"; $B/examples/train_gpt \
        --device \$d --data ${DATA:-tests/data/tiny_corpus.txt} --steps 60 --batch 16 --block 64 --layers 4 --heads 4 \
        --embd 128 --eval-every 20 --sample 200 --log-every 10 || rc=1; done; exit \$rc" ;;
    bench)
      run_step gpt_step 420 env DEVICE=cuda PYTHON=python3 bash bench/gpt_step.sh "$B" all 3
      run_step allreduce 120 mpirun -np 1 "$B/bench/bench_allreduce" --device cuda --backend nccl ;;
    *) echo "gpu_session.sh: unknown step '$s' (build, test, cpu, train, bench)" >&2; exit 2 ;;
  esac
done
