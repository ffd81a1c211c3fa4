#!/usr/bin/env bash
# loom_plan against the runs Megatron-LM published: Narayanan et al. 2021,
# "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM" (SC'21, arXiv 2104.04473), Table 1 (weak scaling on Selene,
# DGX A100 80GB nodes, 8 x 200 Gb/s HDR InfiniBand each; vocab 51200, seq
# 2048, fp16, full activation recomputation). Their "achieved teraFLOP/s per
# GPU" counts recomputation's FLOPs (their eq. 3), so it compares with the
# planner's HFU x 312, not its MFU. The micro-batch size is not in the table:
# 1 is assumed, and the layers are split Megatron's way (--partition blocks).
#
# Checked against the source: every row below is Table 1 of the paper's text
# (found through the search tool's code index, 2026-11-24), and the abstract's
# "502 petaFLOP/s on 3072 GPUs ... 52% of theoretical peak" is its last row
# (502e15 / 3072 = 163.4 TFLOP/s = 52% of the A100's 312). 163 TFLOP/s / 52%
# belong to the 1T (t 8, p 64) and 530B rows, not to a 175B run: the 1536-GPU
# row is the 145.6B model (t 8, p 8) at 148. GPT-3 175B's own figures (Table 2,
# section 5.1) are planned in docs/09-planner.md.
#
# Usage: bench/plan_megatron.sh [build dir]
set -euo pipefail
B=${1:-build}
printf "%-8s %-26s %6s %6s %9s %9s %7s   %s\n" params "layers x width / heads" "(t,p)" GPUs "published" planned gap binds
# params heads width layers t p gpus batch published-TFLOP/s
while read -r name heads width layers t p n batch published; do
  dp=$((n / (t * p)))
  m=$((batch / dp))
  out=$("$B/plan/loom_plan" --machine a100 --layers "$layers" --embd "$width" --heads "$heads" --vocab 51200 \
        --block 2048 --tp "$t" --pp "$p" --dp "$dp" --batch 1 --microbatches "$m" --dtype fp16 --recompute \
        --partition blocks ${EXTRA:-})
  hfu=$(sed -n 's/.*HFU \([0-9.]*\)%.*/\1/p' <<< "$out")
  planned=$(echo "$hfu * 312 / 100" | bc -l)
  printf "%-8s %-26s %6s %6d %9s %9.0f %+6.0f%%   %s\n" "$name" "$layers x $width / $heads" "($t,$p)" "$n" "$published" \
         "$planned" "$(echo "($planned - $published) * 100 / $published" | bc -l)" "$(sed -n 's/^binds: //p' <<< "$out")"
done <<'TABLE'
1.7B 24 2304 24 1 1 32 512 137
3.6B 32 3072 30 2 1 64 512 138
7.5B 32 4096 36 4 1 128 512 142
18.4B 48 6144 40 8 1 256 1024 135
39.1B 64 8192 48 8 2 512 1536 138
76.1B 80 10240 60 8 4 1024 1792 140
145.6B 96 12288 80 8 8 1536 2304 148
310.1B 128 16384 96 8 16 1920 2160 155
529.6B 128 20480 105 8 35 2520 2520 163
1008B 160 25600 128 8 64 3072 3072 163
TABLE
