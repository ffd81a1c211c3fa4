#!/usr/bin/env bash
# README command 1: set up, build, and train a small char-level GPT on Debian's
# fortunes for a few minutes on the CPU, printing losses and a text sample.
# Extra arguments go to train_gpt (e.g. --steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash examples/setup_debian.sh
exec build/examples/train_gpt --steps 600 --batch 16 --block 64 --layers 4 --heads 4 --embd 128 \
  --lr 3e-3 --warmup 50 --eval-every 100 --sample 400 --save out/gpt.safetensors "$@"
