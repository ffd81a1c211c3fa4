#!/usr/bin/python3
"""The PyTorch side of bench/gpt_step: one GPT training step, timed.

The same model and step as bench/gpt_step.cpp (and loom's nn::GPT): GPT-2
architecture as nanoGPT writes it (pre-LN blocks, tanh GELU, plain-matmul
causal attention: q @ kᵀ, masked_fill, softmax, @ v), LM head tied to wte,
fp32, dropout 0. One step = forward + cross-entropy + backward + AdamW step
(torch.optim.AdamW, nanoGPT's groups: weight decay 0.1 on the 2-D Linear
weights only) + zero_grad(set_to_none=True). Random tokens; the numbers do not
matter, only the time.

Usage (Debian's python3-torch):
    /usr/bin/python3 bench/gpt_step.py --config small --threads 1 [--warmup 3] [--steps 15]
Prints one line:  pytorch <config> threads=<n> ms_per_step=<median> tokens_per_s=<t> min_ms=<fastest step>
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # layers, heads, embd, block, batch
    "small": (4, 4, 128, 64, 16),
    "medium": (6, 6, 384, 256, 8),
}
VOCAB = 65


class CausalSelfAttention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.H
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, hd).transpose(1, 2) for t in (q, k, v))  # [B, H, T, hd]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, H)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, C, block):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, C)
        self.wpe = nn.Embedding(block, C)
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():  # GPT-2 init (as loom's nn::GPT)
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=CONFIGS, default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    L, H, C, T, B = CONFIGS[a.config]
    model = GPT(L, H, C, T)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3)
    idx = torch.randint(0, VOCAB, (B, T))
    targets = torch.randint(0, VOCAB, (B, T))

    def step():
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    ms = statistics.median(times)
    print(f"pytorch {a.config} threads={a.threads} ms_per_step={ms:.2f} tokens_per_s={B * T / (ms / 1000.0):.0f} "
          f"min_ms={min(times):.2f}")


if __name__ == "__main__":
    main()
