#!/usr/bin/python3
"""The PyTorch side of bench/gpt_step: one GPT training step, timed.

The same model and step as bench/gpt_step.cpp (and loom's nn::GPT; the model
is tests/reference/torch_gpt.py, the one make_reference.py uses): GPT-2
architecture as nanoGPT writes it (pre-LN blocks, tanh GELU, plain-matmul
causal attention: q @ kᵀ, masked_fill, softmax, @ v), LM head tied to wte,
fp32, dropout 0. One step = forward + cross-entropy + backward + AdamW step
(torch.optim.AdamW, nanoGPT's groups: weight decay 0.1 on the 2-D Linear
weights only) + zero_grad(set_to_none=True). Random tokens; the numbers do not
matter, only the time.

--device cuda runs it on the GPU as bench_gpt_step --device cuda does: built
on the CPU, moved, the step's loss.item() its host wait; PyTorch eager, no
torch.compile, TF32 off unless --tf32 (torch.backends.cuda.matmul.allow_tf32,
which is also what loom's --tf32 switches).

Usage (Debian's python3-torch; on the GPU machine its python3, PyTorch 2.11):
    /usr/bin/python3 bench/gpt_step.py --config small --threads 1 [--warmup 3] [--steps 15] [--device cuda] [--tf32]
Prints one line:  pytorch <config> threads=<n> ms_per_step=<median> tokens_per_s=<t> min_ms=<fastest step>
  device=<cpu|cuda:N> peak_mib=<torch.cuda.max_memory_allocated, GPU only>
  cpu_ms=<median step in the main thread's CPU time: at --threads 1, the step's cost on a busy machine>
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from torch_gpt import GPT, GPTConfig, adamw_param_groups, init_gpt2, loss_fn  # noqa: E402 (the path above)

CONFIGS = {  # layers, heads, embd, block, batch
    "small": (4, 4, 128, 64, 16),
    "medium": (6, 6, 384, 256, 8),
    "gpt124m": (12, 12, 768, 1024, 8),  # GPT-2 124M's shape, char vocabulary (issue 13)
}
VOCAB = 65


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=CONFIGS, default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    L, H, C, T, B = CONFIGS[a.config]
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=L, n_head=H, n_embd=C))
    init_gpt2(model)
    model.to(device)
    # Per-parameter AdamW (foreach=False): the loop loom's optim::AdamW runs.
    opt = torch.optim.AdamW(adamw_param_groups(model, 0.1), lr=1e-3, foreach=False)
    idx = torch.randint(0, VOCAB, (B, T)).to(device)
    targets = torch.randint(0, VOCAB, (B, T)).to(device)

    def step():
        logits = model(idx)
        loss = loss_fn(logits, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(a.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, cpu_times = [], []  # wall and this thread's CPU time per step
    for _ in range(a.steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
        cpu_times.append((time.thread_time() - c0) * 1000.0)
    ms = statistics.median(times)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    print(f"pytorch {a.config} threads={a.threads} ms_per_step={ms:.2f} tokens_per_s={B * T / (ms / 1000.0):.0f} "
          f"min_ms={min(times):.2f} device={device} peak_mib={peak:.1f} cpu_ms={statistics.median(cpu_times):.2f}")


if __name__ == "__main__":
    main()
