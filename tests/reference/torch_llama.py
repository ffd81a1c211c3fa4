"""loom's Llama blocks (nn/gpt.h with GPTConfig::set_arch("llama")) in plain
PyTorch, the reference make_llama_reference.py writes numbers from.

The math is transformers' LlamaForCausalLM (modeling_llama.py), written out:
RMSNorm (x * rsqrt(mean(x²) + eps) * weight), rotary embeddings in the
rotate-half layout (LlamaRotaryEmbedding's float32 inv_freq and cos/sin of
cat(freqs, freqs); apply_rotary_pos_emb: q cos + rotate_half(q) sin),
grouped-query attention (repeat_kv), SwiGLU MLP (down(silu(gate x) * up x)),
no biases, an untied lm_head. Names and named_parameters() order are loom's:
wte, blocks.<i>.{ln_1, attn.c_attn (q, k, v stacked), attn.c_proj, ln_2,
mlp.c_gate, mlp.c_fc (up), mlp.c_proj (down)}, ln_f, lm_head.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    mlp_hidden: int
    rope_base: float
    norm_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_cos_sin(T, hd, base):
    """transformers' LlamaRotaryEmbedding (default rope type): [T, hd] each."""
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    """[B, Hkv, T, hd] -> [B, Hkv * n_rep, T, hd]: kv head j serves query heads j n_rep .. (j+1) n_rep - 1."""
    B, Hkv, T, hd = x.shape
    return x[:, :, None, :, :].expand(B, Hkv, n_rep, T, hd).reshape(B, Hkv * n_rep, T, hd)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.n_embd // cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, cfg.n_embd + 2 * cfg.n_kv_head * hd, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x):
        cfg = self.cfg
        B, T, C = x.shape
        H, Hkv, hd = cfg.n_head, cfg.n_kv_head, C // cfg.n_head
        q, k, v = self.c_attn(x).split([C, Hkv * hd, Hkv * hd], dim=2)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, Hkv, hd).transpose(1, 2)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        cos, sin = rope_cos_sin(T, hd, cfg.rope_base)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_gate = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=False)
        self.c_fc = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=False)
        self.c_proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln_2 = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)  # untied

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def init_weights(model, gen):
    """loom's init: RMSNorm weights 1, Linear and Embedding weights N(0, 0.02),
    residual projections (c_proj) N(0, 0.02 / sqrt(2 n_layer))."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * model.cfg.n_layer) if name.endswith("c_proj.weight") else 0.02
                p.normal_(0.0, std, generator=gen)


def adamw_param_groups(model, weight_decay):
    """loom's optim/param_groups rule: decay every matrix but the embeddings (lm_head is decayed)."""
    params = list(model.named_parameters())
    decayed = [p for n, p in params if p.dim() == 2 and "wte" not in n]
    others = [p for n, p in params if not (p.dim() == 2 and "wte" not in n)]
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": others, "weight_decay": 0.0}]
