#!/usr/bin/env bash
# Every GPU check in one command, on the GPU machine (the device tool), from
# the bundle tests/cuda/build_bundle.sh built here: nothing is compiled there.
#
#   bash tests/cuda/gpu_runner.sh            # phases 1-7 under one deadline (DEADLINE=540 s)
#   bash tests/cuda/gpu_runner.sh 3 5        # only those phases (to rerun what failed)
#
# Phases (each step capped by its own limit and by the time left):
#   1 device    nvidia-smi; an ldd scan of the bundle (a missing library's folder is looked
#               for and added to LD_LIBRARY_PATH); test_cuda_device
#   2 ops       each op test binary once, as a whole process (test_cuda_moe: index_add's sort, an MoE layer;
#               test_cuda_rows_fast: the fast row kernels;
#               test_cuda_flash_attention_mma(_backward): the tensor-core attention forward, backward;
#               test_cuda_launch_count, test_cuda_optim_multi_tensor: the launch counter, one-launch AdamW;
#               test_cuda_gemm_lt: the bf16/fp16 GEMMs on cuBLASLt; test_cuda_linear_gelu: linear + GELU in
#               one cuBLASLt call; test_cuda_grad_multi_tensor: one-launch unscale + found_inf, grad norm,
#               clipping scale)
#   3 comm      NCCL at np 1; the MPI backend staging GPU tensors at np 1 and 2; the NCCL watchdog
#   4 e2e       test_cuda_train_gpt(_moe, _parallel), gtest-sharded over several processes at once
#   5 train     train_gpt 60 steps on the GPU and on the CPU, fp32/bf16/fp16 (and fp32, bf16, fp16 with the
#               fast kernels, LOOM_CUDA_KERNELS=fast: bf16's, fp16's GEMMs on cuBLASLt, fp16's one-launch unscale);
#               losses compared
#   6 bench     bench_attention (composition vs flash, CUDA cores vs tensor cores); the row kernels fast vs reference;
#               bench/gpt_step.sh (small, gpt124m) beside PyTorch eager; the NCCL all-reduce;
#               gpt124m again with LOOM_CUDA_KERNELS=fast; gpt124m bf16 reference vs fast (cuBLASLt);
#               train_gpt --trace's launches per step (fp32 and bf16, reference and fast)
#   7 memcheck  compute-sanitizer --tool memcheck over three op test binaries, memcheck and racecheck over the tensor-core attention
# Logs: $OUT/<phase>.log (7 files) and $OUT/summary.txt, which lists each step
# as passed / failed / skipped (reason) / not run (one GPU) / not run (deadline).
# Tests that need two GPUs are "not run (one GPU)", never passed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
t_start=$SECONDS
deadline=${DEADLINE:-540}
bundle=${BUNDLE:-build-gpu-bundle}  # what the device tool carries: the packed bundle alone
run_dir=${RUN_DIR:-build-gpu-run}    # where it is unpacked (ignored; not carried: 40 MB)
out=${OUT:-out/gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.txt
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(1 2 3 4 5 6 7)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # cross-memory attach is often refused in VMs
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} PYTHONUNBUFFERED=1 GTEST_COLOR=no  # (mpirun's pty made gtest colour)
mpi_env=(env LOOM_COLLECTIVE_TIMEOUT=60 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)  # as tests/mpi/CMakeLists.txt
mpirun_=(mpirun --allow-run-as-root --oversubscribe)  # the bundle's (env.sh puts it first on PATH)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

left() { echo $((deadline - (SECONDS - t_start))); }
note() { echo "$*" | tee -a "$summary"; }

# The bundle, unpacked: bin/ holds every program (flat). UNPACKED=1: RUN_DIR
# is laid out already (plan B, tests/cuda/build_on_device.sh: built here
# without MPI, so the steps that need mpirun are "not run (plan B: no MPI)").
if [ "${UNPACKED:-0}" != 1 ]; then
  [ -f "$bundle/loom-gpu-bundle.tar.xz" ] || { echo "gpu_runner.sh: no $bundle/loom-gpu-bundle.tar.xz (nice -n 10 bash tests/cuda/build_bundle.sh here first)" >&2; exit 2; }
  rm -rf "${run_dir:?}" && mkdir -p "$run_dir/bench" && tar -C "$run_dir" -xJf "$bundle/loom-gpu-bundle.tar.xz" || exit 2
fi
bin=$(cd "$run_dir/bin" && pwd)
ln -sf ../bin/bench_gpt_step "$run_dir/bench/bench_gpt_step"  # the layout bench/gpt_step.sh expects of a build
# The bundle carries Open MPI (mpirun, its plugins and libraries: bundle_runtime.sh);
# env.sh points Open MPI and PMIx at them and puts bin/ first on PATH.
bundle_root=$(cd "$run_dir" && pwd)
[ -f "$run_dir/env.sh" ] && . "$run_dir/env.sh"
mpiexec_path=$(command -v mpirun || true)
[ -n "$mpiexec_path" ] && export LOOM_MPIEXEC=$mpiexec_path
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
{
  echo "gpu_runner.sh $(date -u '+%Y-%m-%d %H:%M:%S UTC'), phases ${phases[*]}, deadline ${deadline} s"
  echo "host: $(hostname), $(nproc) cores, $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "GPUs: $gpus $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
  echo "mpirun: ${mpiexec_path:-none}; python3: $(python3 -c 'import sys, torch; print(sys.executable, "torch", torch.__version__)' 2>/dev/null || echo "no torch")"
  sed 's/^/bundle /' "$run_dir/BUNDLE.txt"
} >> "$summary"

# Libraries: each one ldd cannot find is looked for where CUDA, NCCL and
# Python's nvidia-* wheels put theirs, and its folder added to the search path.
missing() { for f in "$bin"/*; do ldd "$f" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u; }
added=""
read -ra lib_roots <<< "${LIB_ROOTS:-$(echo /usr/local/cuda* /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/local/lib /opt)}"
for lib in $(missing); do
  found=$(timeout 30 find "${lib_roots[@]}" -maxdepth 10 -name "$lib" 2>/dev/null | head -n 1)
  if [ -n "$found" ]; then
    found=$(dirname "$found")
    case " $added " in *" $found "*) continue ;; esac  # cudart, cuBLAS and NCCL often share one folder
    added+=" $found"
    export LD_LIBRARY_PATH=$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
done

# verdict FILE RC SECONDS: one line for a gtest binary's output (any other
# program: passed on rc 0). Skips whose reason names two GPUs count apart.
verdict() {
  local f=$1 rc=$2 secs=$3
  awk -v rc="$rc" -v secs="$secs" -v gpus="$gpus" '
    { gsub(/\033\[[0-9;]*m/, "") }
    /: Skipped$/ { getline reason; if (reason ~ /^no CUDA device/) reason = "no CUDA device"; reason = substr(reason, 1, 100); next }
    /^\[       OK \] .*\([0-9]+ ms\)$/ { ok++ }
    /^\[  FAILED  \] .*\([0-9]+ ms\)$/ { failed++; name = $4; sub(/,$/, "", name); if (failed <= 3) names = names " " name }
    /^\[  SKIPPED \] .*\([0-9]+ ms\)$/ {
      if (reason ~ /2 GPUs/) onegpu++; else { skipped++; if (!(reason in seen)) { seen[reason]; why = why (why ? "; " : "") reason } }
      reason = ""
    }
    /no CUDA device|no GPU|cudaGetDeviceCount/ && !nodev { nodev = match($0, /\(cudaError[A-Za-z]+\)/) ? substr($0, RSTART + 1, RLENGTH - 2) : "no CUDA device" }
    END {
      extra = (onegpu ? ", not run (one GPU): " onegpu : "") (skipped ? ", skipped " skipped " (" why ")" : "")
      t = " [" secs " s]"
      if (rc == 124 || rc == 137) { print "failed (timed out; " ok + 0 " passed, " failed + 0 " failed" extra ")" t; exit }
      if (failed || rc != 0) {
        if (!ok && !failed && gpus == 0 && nodev) { print "skipped (no GPU: " nodev ")" t; exit }
        print "failed (rc " rc (failed ? ", " failed " failed:" names : "") (ok ? ", " ok " passed" : "") extra ")" t; exit
      }
      if (ok) { print "passed (" ok " ok" extra ")" t; exit }
      if (onegpu && !skipped) { print "not run (one GPU: " onegpu " tests need 2)" t; exit }
      if (skipped) { print "skipped (" skipped " tests: " why (onegpu ? "; not run (one GPU): " onegpu : "") ")" t; exit }
      print "passed" t
    }' "$f"
}

# step PHASE NAME LIMIT CMD...: CMD's output appended to PHASE.log, at most
# min(LIMIT, time left) seconds; its verdict to the summary.
step() {
  local phase=$1 name=$2 limit=$3 rc t0=$SECONDS
  shift 3
  local lim=$(( $(left) - 5 < limit ? $(left) - 5 : limit ))
  if [ "$lim" -lt 10 ]; then note "  $name: not run (deadline)"; return; fi
  echo "=== $name (limit ${lim} s): $*" >> "$out/$phase.log"
  timeout -k 5 "$lim" "$@" > "$tmp/step.log" 2>&1
  rc=$?
  cat "$tmp/step.log" >> "$out/$phase.log"
  echo "=== $name: rc $rc, $((SECONDS - t0)) s" >> "$out/$phase.log"
  note "  $name: $(verdict "$tmp/step.log" "$rc" "$((SECONDS - t0))")"
}

phase_device() {
  if command -v nvidia-smi > /dev/null; then step device nvidia-smi 20 nvidia-smi
  else note "  nvidia-smi: skipped (not installed: no GPU driver here)"; fi
  local still; still=$(missing | tr '\n' ' ')
  { echo "=== ldd (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"; for f in "$bin"/*; do echo "$(basename "$f"):"; ldd "$f"; done; } \
    >> "$out/device.log" 2>&1
  if [ -z "$still" ]; then note "  ldd: passed (every library found${added:+; LD_LIBRARY_PATH +=$added})"
  else note "  ldd: failed (missing: $still)"; fi
  # Only glibc, the driver and CUDA's libraries may come from the machine (tests/cuda/bundle_runtime.sh).
  local foreign=""
  [ "${UNPACKED:-0}" = 1 ] || foreign=$(bash tests/cuda/bundle_ldd_check.sh "$bundle_root" 2>> "$out/device.log")
  if [ "${UNPACKED:-0}" = 1 ]; then note "  machine's libraries: not checked (plan B: built on this machine, against its own)"
  elif [ -z "$foreign" ]; then note "  machine's libraries: passed (only glibc, the driver's and CUDA's: $(bash tests/cuda/bundle_ldd_check.sh "$bundle_root" --cuda))"
  else note "  machine's libraries: failed (loaded from outside the bundle: $foreign)"; fi
  step device test_cuda_device 60 "$bin/test_cuda_device"
}

phase_ops() {
  for t in allocator copy dropout nn ops optim llama moe; do step ops "test_cuda_$t" 90 "$bin/test_cuda_$t"; done
  step ops test_cuda_launch_count 60 "$bin/test_cuda_launch_count"  # a toy step's launches = the ops' predicted count
  step ops test_cuda_optim_multi_tensor 60 "$bin/test_cuda_optim_multi_tensor"  # one-launch AdamW vs the per-param kernel
  step ops test_cuda_grad_multi_tensor 60 "$bin/test_cuda_grad_multi_tensor"  # one-launch unscale, norm, clip vs per tensor
  step ops test_cuda_attention 90 "$bin/test_cuda_attention"  # flash attention vs the CPU (tensor/cuda/fast/)
  step ops test_cuda_flash_attention_mma 90 "$bin/test_cuda_flash_attention_mma"  # the tensor-core forward vs the reference kernel and the CPU
  step ops test_cuda_flash_attention_mma_backward 120 "$bin/test_cuda_flash_attention_mma_backward"  # its backward, likewise
  step ops test_cuda_rows_fast 90 "$bin/test_cuda_rows_fast"  # the fast row kernels vs CPU and reference (tensor/cuda/fast/)
  step ops test_cuda_gemm_lt 90 "$bin/test_cuda_gemm_lt"  # bf16/fp16 GEMMs on cuBLASLt vs CPU and reference (tensor/cuda/fast/gemm_lt.h)
  step ops test_cuda_linear_gelu 90 "$bin/test_cuda_linear_gelu"  # linear + GELU (GELU_AUX_BIAS) vs CPU and reference, fwd + bwd
}

phase_comm() {
  if [ ! -x "$bin/mpi_cuda_nccl" ]; then note "  comm: not run (plan B: no MPI)"; return; fi
  step comm "mpi_cuda_nccl np1" 90 "${mpi_env[@]}" "${mpirun_[@]}" -np 1 "$bin/mpi_cuda_nccl"
  step comm "mpi_cuda_collectives np1" 90 "${mpi_env[@]}" "${mpirun_[@]}" -np 1 "$bin/mpi_cuda_collectives"
  step comm "mpi_cuda_collectives np2" 90 "${mpi_env[@]}" "${mpirun_[@]}" -np 2 "$bin/mpi_cuda_collectives"
  step comm test_cuda_nccl_watchdog 150 "$bin/test_cuda_nccl_watchdog"
}

# Each end-to-end test launches train_gpt several times (under mpiexec for the
# parallel ones): gtest's sharding runs SHARDS processes of each binary at once.
phase_e2e() {
  local shards=${SHARDS:-4} lim t0=$SECONDS pids=() b i
  lim=$(( $(left) - 10 < 300 ? $(left) - 10 : 300 ))
  if [ "$lim" -lt 20 ]; then note "  e2e: not run (deadline)"; return; fi
  local binaries=(test_cuda_train_gpt test_cuda_train_gpt_moe test_cuda_train_gpt_parallel)
  [ -x "$bin/test_cuda_train_gpt_parallel" ] || { binaries=(test_cuda_train_gpt test_cuda_train_gpt_moe); note "  test_cuda_train_gpt_parallel: not run (plan B: no MPI)"; }
  for b in "${binaries[@]}"; do
    for ((i = 0; i < shards; ++i)); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout -k 5 "$lim" "${mpi_env[@]}" "$bin/$b" \
        > "$tmp/$b.$i.log" 2>&1 &
      pids+=("$!:$b.$i")
    done
  done
  for p in "${pids[@]}"; do wait "${p%%:*}"; echo "${p#*:} $?" >> "$tmp/e2e.rc"; done
  for b in "${binaries[@]}"; do
    : > "$tmp/$b.all"
    local worst=0
    for ((i = 0; i < shards; ++i)); do
      { echo "=== $b shard $i of $shards (limit ${lim} s)"; cat "$tmp/$b.$i.log"; } >> "$out/e2e.log"
      cat "$tmp/$b.$i.log" >> "$tmp/$b.all"
      rc=$(awk -v k="$b.$i" '$1 == k {print $2}' "$tmp/e2e.rc")
      [ "$rc" -gt "$worst" ] && worst=$rc
    done
    note "  $b ($shards shards): $(verdict "$tmp/$b.all" "$worst" "$((SECONDS - t0))")"
  done
}

# The main job on the GPU, then the same 60 steps on the CPU (TF32 off): how
# far apart the losses are is measured here, not asserted.
phase_train() {
  local dt dev
  # fp32-fast, bf16-fast, fp16-fast: the GPU run again with the fast kernels (bf16, fp16: their GEMMs on cuBLASLt; fp16:
  # the loss scaler's one-launch unscale + found_inf), against the CPU run.
  for dt in fp32 bf16 fp16 fp32-fast bf16-fast fp16-fast; do
    for dev in cuda cpu; do
      if [[ $dt == *-fast ]] && [ "$dev" = cpu ]; then cp "$tmp/${dt%-fast}.cpu.jsonl" "$tmp/$dt.cpu.jsonl" 2> /dev/null; continue; fi
      rm -f "$tmp/$dt.$dev.jsonl"
      step train "train_gpt $dt --device $dev" 90 env LOOM_CUDA_KERNELS="$([[ $dt == *-fast ]] && echo fast || echo reference)" \
        "$bin/train_gpt" --device "$dev" --dtype "${dt%-fast}" \
        --data tests/data/tiny_corpus.txt --steps 60 --batch 16 --block 64 --layers 4 --heads 4 --embd 128 \
        --eval-every 0 --sample 0 --log-every 20 --log "$tmp/$dt.$dev.jsonl"
    done
    python3 - "$dt" "$tmp/$dt.cuda.jsonl" "$tmp/$dt.cpu.jsonl" << 'EOF' 2>&1 | tee -a "$out/train.log" | tail -n 1 | tee -a "$summary"
import json, os, sys
dt, gpu, cpu = sys.argv[1:4]
read = lambda p: [json.loads(l)["loss"] for l in open(p) if l.strip()] if os.path.exists(p) else []
g, c = read(gpu), read(cpu)
if not g or not c:
    print(f"  compare {dt}: not compared (GPU losses: {len(g)}, CPU losses: {len(c)})")
    sys.exit()
n = min(len(g), len(c))
rel = [abs(g[i] - c[i]) / abs(c[i]) for i in range(n)]
print(f"== {dt}: step, CPU loss, GPU loss, relative difference")
for i in list(range(0, n, 10)) + [n - 1]:
    print(f"{i:5d} {c[i]:.7f} {g[i]:.7f} {rel[i]:.2e}")
worst = max(range(n), key=lambda i: rel[i])
print(f"  compare {dt}: {n} steps, first-step rel. diff {rel[0]:.2e}, worst {rel[worst]:.2e} at step {worst},"
      f" final CPU {c[n-1]:.5f} GPU {g[n-1]:.5f} (measured, not asserted)")
EOF
  done
}

phase_bench() {
  local c
  # One layer's attention at GPT-2 124M's shape: the composition vs flash attention.
  step bench "bench_attention gpt124m bf16" 60 "$bin/bench_attention" --device cuda --dtype bf16
  step bench "bench_attention gpt124m fp32" 60 "$bin/bench_attention" --device cuda --dtype fp32
  step bench "bench_attention hd 128 bf16" 60 "$bin/bench_attention" --device cuda --dtype bf16 --H 6 --hd 128  # tensor cores alone
  step bench bench_row_kernels 60 "$bin/bench_row_kernels" --reps 10  # fast vs reference row kernels, GPT-2 124M shapes
  for c in small gpt124m; do
    if python3 -c 'import torch' 2> /dev/null; then
      step bench "gpt_step $c" 180 env DEVICE=cuda PYTHON=python3 bash bench/gpt_step.sh "$run_dir" "$c" 1
    else  # loom's side alone
      note "  gpt_step $c, PyTorch: skipped (python3 has no torch)"
      step bench "bench_gpt_step $c" 120 "$bin/bench_gpt_step" --config "$c" --device cuda --warmup 3 --steps 10
    fi
  done
  if [ -x "$bin/bench_allreduce" ]; then
    step bench "bench_allreduce nccl np1" 60 "${mpirun_[@]}" -np 1 "$bin/bench_allreduce" --device cuda --backend nccl
  else note "  bench_allreduce: not run (plan B: no MPI)"; fi
  step bench "bench_gpt_step gpt124m, fast row kernels" 120 env LOOM_CUDA_KERNELS=fast "$bin/bench_gpt_step" \
    --config gpt124m --device cuda --warmup 3 --steps 10  # the step with tensor/cuda/fast/ (beside the reference's above)
  # The bf16 step both ways: the fast kernels' GEMMs on cuBLASLt (tensor/cuda/fast/gemm_lt.h) vs the reference's widen-sgemm-round.
  for k in reference fast; do
    step bench "bench_gpt_step gpt124m bf16, $k kernels" 90 env LOOM_CUDA_KERNELS=$k "$bin/bench_gpt_step" \
      --config gpt124m --device cuda --dtype bf16 --warmup 3 --steps 10
  done
  # Launches per step (tensor/cuda/launch_count.h): the reference kernels, then the fast ones (one-launch AdamW;
  # in bf16 also the cuBLASLt GEMMs: no conversions, bias and bias gradient in the epilogues).
  local k dt
  for dt in fp32 bf16; do
    for k in reference fast; do
      step bench "train_gpt --trace launches, $dt, $k kernels" 60 env LOOM_CUDA_KERNELS=$k "$bin/train_gpt" \
        --device cuda --dtype $dt --data tests/data/tiny_corpus.txt --steps 3 --batch 16 --block 64 --layers 4 \
        --heads 4 --embd 128 --eval-every 0 --sample 0 --trace "$tmp/launches.$dt.$k.json"
      grep -h "GPU launches per step" "$out/bench.log" | tail -n 1 | sed "s/^/  $dt, $k kernels: /" | tee -a "$summary"
    done
  done
}

phase_memcheck() {
  if ! command -v compute-sanitizer > /dev/null; then note "  memcheck: skipped (no compute-sanitizer)"; return; fi
  local t
  # gVisor's runtime: compute-sanitizer refuses the device ("Device not supported", then error 999).
  timeout 60 compute-sanitizer --tool memcheck "$bin/test_cuda_device" > "$tmp/probe.log" 2>&1
  if grep -Eq "Device not supported|error 999|CUDA_ERROR_UNKNOWN" "$tmp/probe.log"; then
    cat "$tmp/probe.log" >> "$out/memcheck.log"
    note "  memcheck: not run (gVisor: compute-sanitizer refused the device)"
    return
  fi
  for t in ops nn; do
    step memcheck "memcheck test_cuda_$t" 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda_$t"
  done
  step memcheck "memcheck test_cuda_rows_fast" 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda_rows_fast"
  # The tensor-core attention (forward and backward, T 257 and 100, head 64 and 128): its
  # shared tiles under memcheck, and under racecheck their __syncthreads.
  for t in memcheck racecheck; do
    step memcheck "$t tensor-core attention" 150 compute-sanitizer --tool "$t" --error-exitcode 9 \
      "$bin/test_cuda_flash_attention_mma_backward" --gtest_filter='*TwoRunsAreBitIdentical:*FastKernelsPick*'
  done
}

names=([1]=device [2]=ops [3]=comm [4]=e2e [5]=train [6]=bench [7]=memcheck)
for p in "${phases[@]}"; do
  n=${names[$p]:-}
  [ -n "$n" ] || { echo "gpu_runner.sh: unknown phase '$p' (1-7)" >&2; exit 2; }
  note "phase $p $n ($(left) s left)"
  "phase_$n"
done
note "done in $((SECONDS - t_start)) s of $deadline"
