#!/bin/bash
# bench/gpt_step.sh: one GPT training step, loom vs PyTorch, side by side.
#
# Runs bench_gpt_step (loom) and bench/gpt_step.py (PyTorch; by default 1.13
# from Debian's python3-torch, PYTHON=... picks another interpreter) back to back on the same config and thread count, `rounds`
# times alternating, so that whatever else the machine is doing slows both
# alike. Each run warms up, times `steps` steps and reports its median; the
# table shows the median over rounds of those medians, tokens/s and the ratio
# loom / PyTorch in tokens/s (> 1: loom is faster). On the CPU a second table
# gives each side's median step in its main thread's CPU time (cpu_ms), which
# at 1 thread is the step's cost even on a machine busy with other work.
#
# Configs (issue 3, "Speed"; issue 13 for gpt124m):
#   small:   4 layers,  4 heads, 128 embd, block   64, batch 16, vocab 65 -- 1 thread
#   medium:  6 layers,  6 heads, 384 embd, block  256, batch  8, vocab 65 -- 2 threads
#   gpt124m: 12 layers, 12 heads, 768 embd, block 1024, batch 8, vocab 65 -- GPU only
# DEVICE=cuda (or cuda:N) runs both sides on the GPU (PyTorch eager, TF32 off;
# TF32=1 turns it on for both); `all` is then small, medium and gpt124m, and
# the table adds each side's peak GPU memory. On the GPU machine:
#   DEVICE=cuda PYTHON=python3 bash bench/gpt_step.sh build-gpu all 3
# Both sides get OMP_WAIT_POLICY=passive (idle OpenMP threads sleep instead of
# spinning: with 2 cores shared, a spinning thread takes the core the other
# side's work needs). WAIT=own leaves each side its own default instead, as a
# user runs it: loom's brief spin (GOMP_SPINCOUNT=10000, tensor/cpu/thread_wait.h),
# PyTorch's OpenMP default (libgomp: spin ~300,000 pauses, then sleep); at 2
# threads a passive thread is woken from sleep at every parallel loop.
#
# With `bf16` as the fifth argument it compares loom with loom instead: the
# fp32 step, the --dtype bf16 step (GEMMs natively in bf16 where the CPU has
# AVX512_BF16 or AMX: tensor/cpu/gemm_bf16.h) and the bf16 step with
# LOOM_GEMM_BF16=fp32 (bf16 GEMMs widened to fp32, the reference path),
# alternating in each round; the ratio is fp32 ms / bf16 ms (> 1: bf16 is faster).
# With `attention` it compares the step with LOOM_ATTENTION=reference (the
# attention composition nn/attention.h writes out) and the default (the fused
# op of tensor/ops_attention.cpp, which skips the masked blocks); the ratio is
# reference ms / fused ms.
#
# PYTHON2=... adds a second PyTorch to the same rounds, for a current
# PyTorch beside Debian's 1.13 - a venv with PyPI's torch 2.x
# (python3 -m venv v && v/bin/pip install torch: several GB, with its CUDA
# libraries; the hf tests' venv reuses Debian's 1.13): PYTHON2=v/bin/python. The table then
# gains "torch2 ms" and "ratio2" (loom / that PyTorch in tokens/s).
#
# Usage: [PYTHON=python3] [PYTHON2=venv/bin/python] [WAIT=own] [DEVICE=cuda] [TF32=1] bench/gpt_step.sh [build-dir] [small|medium|gpt124m|all] [rounds] [steps] [torch|bf16|attention]
#   defaults: PYTHON=/usr/bin/python3, DEVICE=cpu, build, all, 3 rounds, 15 steps (medium: 8 steps), torch
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$here/../build}"
which="${2:-all}"
rounds="${3:-3}"
steps="${4:-}"
versus="${5:-torch}"
loom="$build/bench/bench_gpt_step"
py="${PYTHON:-/usr/bin/python3}"
py2="${PYTHON2:-}"
device="${DEVICE:-cpu}"
wait=(OMP_WAIT_POLICY=passive)
[ "${WAIT:-passive}" = own ] && wait=()
dev_args=(--device "$device")
[ "${TF32:-0}" = 1 ] && dev_args+=(--tf32)
[ -x "$loom" ] || { echo "gpt_step.sh: $loom not found (cmake --build $build --target bench_gpt_step)" >&2; exit 1; }

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

declare -A threads=([small]=1 [medium]=2 [gpt124m]=1)
declare -A default_steps=([small]=15 [medium]=8 [gpt124m]=10)
configs=(small medium)
[ "$device" = cpu ] || { threads=([small]=1 [medium]=1 [gpt124m]=1); default_steps=([small]=50 [medium]=50 [gpt124m]=10); configs+=(gpt124m); }
[ "$which" = all ] || configs=("$which")

# loom against loom: each variant is "label|environment|extra arguments",
# run in turn in every round; the ratio is the first variant's ms over the
# second's (> 1: the second is faster).
if [ "$versus" = bf16 ] || [ "$versus" = attention ]; then
  if [ "$versus" = bf16 ]; then
    variants=("fp32 ms||--dtype fp32" "bf16 ms||--dtype bf16" "bf16-via-fp32 ms|LOOM_GEMM_BF16=fp32|--dtype bf16")
    target="target (issue 19, stretch): the bf16 step faster than the fp32 step"
  else
    variants=("reference ms|LOOM_ATTENTION=reference|" "fused ms||")
    target="fused: causal attention as one op skipping its masked blocks (tensor/ops_attention.cpp)"
  fi
  echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1) ($(nproc) cores)," \
    "AVX512_BF16: $(grep -q avx512_bf16 /proc/cpuinfo && echo yes || echo no)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min load average; 2 cores)"
  printf '%-7s %-7s' config threads
  for v in "${variants[@]}"; do printf ' %17s' "${v%%|*}"; done
  printf ' %14s\n' "ratio 1st/2nd"
  for c in "${configs[@]}"; do
    t=${threads[$c]}
    n=${steps:-${default_steps[$c]}}
    declare -A times=()
    for ((r = 1; r <= rounds; ++r)); do
      line=""
      for i in "${!variants[@]}"; do
        IFS='|' read -r _ envs extra <<<"${variants[$i]}"
        # shellcheck disable=SC2086  # envs and extra are lists of words
        out=$(env "${wait[@]}" $envs "$loom" --config "$c" --threads "$t" --warmup 3 --steps "$n" \
          "${dev_args[@]}" $extra)
        line+="${line:+ | }$out"
        times[$i]+="$(echo "$out" | field ms_per_step) "
      done
      echo "  round $r: $line" >&2
    done
    printf '%-7s %-7s' "$c" "$t"
    medians=()
    for i in "${!variants[@]}"; do
      medians+=("$(printf '%s\n' ${times[$i]} | median)")
      printf ' %17.1f' "${medians[$i]}"
    done
    awk -v a="${medians[0]}" -v b="${medians[1]}" 'BEGIN { printf " %13.2fx\n", a / b }'
    unset times
  done
  echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$target"
  exit 0
fi
"$py" -c "import torch" 2>/dev/null || { echo "gpt_step.sh: $py has no torch (apt-get install python3-torch)" >&2; exit 1; }
[ -z "$py2" ] || "$py2" -c "import torch" 2>/dev/null || { echo "gpt_step.sh: PYTHON2=$py2 has no torch" >&2; exit 1; }

# Name the GEMM libraries: loom's (oneDNN, or OpenBLAS with LOOM_GEMM=openblas)
# and the OpenBLAS kernels (Debian's PyTorch 1.13 calls libopenblas;
# OPENBLAS_CORETYPE, when set, overrides its detection).
probe=$(OPENBLAS_VERBOSE=2 "$loom" --config small --warmup 0 --steps 1 2>&1)
core=$(echo "$probe" | sed -n 's/^Core: //p' | head -n 1)
gemm=$(echo "$probe" | sed -n 's/.* gemm=\([a-z]*\).*/\1/p' | head -n 1)
echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1) ($(nproc) cores)"
echo "loom fp32 GEMM: ${gemm:-unknown}; OpenBLAS kernels: ${core:-unknown} (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"
echo "device: $device${TF32:+ (TF32=$TF32)}"
[ "$device" = cpu ] || echo "GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
torch_version() { "$1" -c 'import torch; b = torch.backends; print(torch.__version__, "MKL" if b.mkl.is_available() else "no MKL", "oneDNN" if b.mkldnn.is_available() else "no oneDNN")' 2>/dev/null; }
echo "torch: $(torch_version "$py") ($py)"
[ -z "$py2" ] || echo "torch2: $(torch_version "$py2") ($py2)"
echo "wait policy: ${wait[*]:-each side its own default (WAIT=own)}; LOOM_WAKE_THREADS=${LOOM_WAKE_THREADS:-auto}"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min load average; 2 cores)"
rows=() cpu_rows=()
for c in "${configs[@]}"; do
  t=${threads[$c]}
  n=${steps:-${default_steps[$c]}}
  loom_ms=() torch_ms=() torch2_ms=(0) loom_cpu=() torch_cpu=() torch2_cpu=(0)
  for ((r = 1; r <= rounds; ++r)); do
    l=$(env "${wait[@]}" "$loom" --config "$c" --threads "$t" --warmup 3 --steps "$n" "${dev_args[@]}")
    p=$(env "${wait[@]}" "$py" "$here/gpt_step.py" --config "$c" --threads "$t" --warmup 3 --steps "$n" \
      "${dev_args[@]}")
    p2=""
    [ -z "$py2" ] || p2=$(env "${wait[@]}" "$py2" "$here/gpt_step.py" --config "$c" --threads "$t" --warmup 3 \
      --steps "$n" "${dev_args[@]}")
    echo "  round $r: $l | $p${p2:+ | torch2 }$p2" >&2
    loom_ms+=("$(echo "$l" | field ms_per_step)")
    torch_ms+=("$(echo "$p" | field ms_per_step)")
    [ -z "$py2" ] || { [ $r = 1 ] && torch2_ms=(); torch2_ms+=("$(echo "$p2" | field ms_per_step)"); }
    loom_cpu+=("$(echo "$l" | field cpu_ms)")
    torch_cpu+=("$(echo "$p" | field cpu_ms)")
    [ -z "$py2" ] || { [ $r = 1 ] && torch2_cpu=(); torch2_cpu+=("$(echo "$p2" | field cpu_ms)"); }
  done
  lm=$(printf '%s\n' "${loom_ms[@]}" | median)
  pm=$(printf '%s\n' "${torch_ms[@]}" | median)
  p2m=$(printf '%s\n' "${torch2_ms[@]}" | median)
  cpu_rows+=("$c $t $(printf '%s\n' "${loom_cpu[@]}" | median) $(printf '%s\n' "${torch_cpu[@]}" | median)"\
" $(printf '%s\n' "${torch2_cpu[@]}" | median)")
  # Peak memory of the last round (GPU runs; 0 for PyTorch on the CPU).
  rows+=("$c $t $lm $pm $(echo "$l" | field peak_mib) $(echo "$p" | field peak_mib) $p2m")
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"

# The work of one step, as nanoGPT's estimate_mfu counts it (PaLM, appendix B):
# 6 N FLOPs per token for the matmuls' forward and backward (N = parameters
# without the position table; the tied head counts once, as the head's
# matmul), plus 12 L T C for attention's two matmuls. GF/s = that / step time:
# set beside bench_gemm's FMA ceiling, it says how far either side can go.
echo
printf '%-7s %-7s %12s %12s %12s %12s %8s %10s %10s %10s' config threads "loom ms" "torch ms" "loom tok/s" \
  "torch tok/s" ratio "GFLOP" "loom GF/s" "torch GF/s"
[ -z "$py2" ] || printf ' %12s %8s' "torch2 ms" ratio2
[ "$device" = cpu ] && echo || printf ' %12s %12s\n' "loom MiB" "torch MiB"
for row in "${rows[@]}"; do
  read -r c t lm pm lmem pmem p2m <<<"$row"
  case $c in
    small) B=16 T=64 L=4 C=128 ;;
    medium) B=8 T=256 L=6 C=384 ;;
    gpt124m) B=8 T=1024 L=12 C=768 ;;
  esac
  awk -v c="$c" -v t="$t" -v lm="$lm" -v pm="$pm" -v B="$B" -v T="$T" -v L="$L" -v C="$C" -v V=65 \
    -v gpu="$([ "$device" = cpu ] && echo 0 || echo 1)" -v lmem="${lmem:-0}" -v pmem="${pmem:-0}" -v p2m="$p2m" 'BEGIN {
    n = B * T
    N = V * C + L * (12 * C * C + 13 * C) + 2 * C
    gflop = n * (6 * N + 12 * L * T * C) / 1e9
    printf "%-7s %-7s %12.1f %12.1f %12.0f %12.0f %7.2fx %10.2f %10.1f %10.1f", c, t, lm, pm, n / (lm / 1000),
      n / (pm / 1000), pm / lm, gflop, gflop / (lm / 1000), gflop / (pm / 1000)
    if (p2m > 0) printf " %12.1f %7.2fx", p2m, p2m / lm
    if (gpu) printf " %12.0f %12.0f", lmem, pmem
    printf "\n" }'
done
if [ "$device" = cpu ]; then
  # The main thread's CPU time per step (cpu_ms): what a busy machine's waits
  # for a core do not inflate. At 1 thread it is the step's cost and its ratio
  # holds under load; at 2 threads it leaves out the second thread's work.
  echo
  printf '%-7s %-7s %12s %12s %8s' config threads "loom CPU ms" "torch CPU ms" ratio
  [ -z "$py2" ] && echo || printf ' %13s %8s\n' "torch2 CPU ms" ratio2
  for row in "${cpu_rows[@]}"; do
    read -r c t lc pc p2c <<<"$row"
    awk -v c="$c" -v t="$t" -v lc="$lc" -v pc="$pc" -v p2c="$p2c" 'BEGIN {
      printf "%-7s %-7s %12.1f %12.1f %7.2fx", c, t, lc, pc, pc / lc
      if (p2c > 0) printf " %13.1f %7.2fx", p2c, p2c / lc
      printf "\n" }'
  done
  echo "targets (issue 19): loom GF/s >= 75% of bench_gemm's ceiling x threads; >= 1.8x PyTorch 1.13's tokens/s"
  echo "FMA ceiling to set the GF/s beside: build/bench/bench_gemm (per thread; x threads for the step)"
else
  echo "targets (issue 13, fp32, TF32 off): small and medium faster than PyTorch eager (ratio > 1); gpt124m within 1.2x (ratio >= 0.83)"
fi
