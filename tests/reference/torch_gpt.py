"""loom's GPT in PyTorch: the one definition that make_reference.py (the
numbers the C++ tests compare against) and bench/gpt_step.py (the timing
baseline) both use, so the two cannot drift apart.

The same model as loom's nn/gpt.h: GPT-2 architecture with nanoGPT's parameter
names, pre-LN blocks, tanh GELU, plain-matmul causal attention (q @ kᵀ,
masked_fill, softmax, @ v), LM head tied to wte (listed once, as wte.weight),
float32, no dropout. named_parameters() order is loom's order:
wte, wpe, blocks.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_f.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in (q, k, v))  # [B, H, T, hd]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: listed once, as wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def init_gpt2(model, gen=None):
    """GPT-2 init, in named_parameters() order: N(0, 0.02) weights, zero biases,
    LayerNorm 1/0, residual projections N(0, 0.02/sqrt(2L)). gen: a
    torch.Generator (None: torch's global one)."""
    n_layer = model.cfg.n_layer
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                p.normal_(0.0, std, generator=gen)


def is_decayed(name):
    """nanoGPT's (and loom's optim/param_groups) rule: weight decay on the Linear weights only."""
    return name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))


def adamw_param_groups(model, weight_decay):
    params = list(model.named_parameters())
    return [
        {"params": [p for n, p in params if is_decayed(n)], "weight_decay": weight_decay},
        {"params": [p for n, p in params if not is_decayed(n)], "weight_decay": 0.0},
    ]


def loss_fn(logits, targets):
    """Mean cross-entropy over the tokens whose target is not -100."""
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-100)
