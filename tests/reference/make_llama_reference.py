#!/usr/bin/python3
"""Writes tests/reference/llama_reference.safetensors: a PyTorch reference for
loom's Llama blocks (torch_llama.py beside this file), as make_reference.py
does for the GPT-2 blocks: the same entries (every parameter under loom's
names, idx, targets with two ignored, logits, loss, grad.<name>, adamw_losses
of 10 AdamW steps: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.1 on
every matrix but wte).

Config: vocab 65, block 16, n_layer 2, n_head 4, n_kv_head 2 (grouped-query:
each kv head serves 2 query heads), n_embd 32 (head size 8), SwiGLU width 88
(loom's default 8C/3 rounded up to 8), RoPE base 500000 (Llama 3's, not the
default 10000), RMSNorm eps 1e-5, no biases, untied lm_head; weights from
torch.Generator().manual_seed(0).

torch_llama's rotary embeddings and repeat_kv were checked equal (max
difference 0.0) to transformers' LlamaRotaryEmbedding, apply_rotary_pos_emb
and repeat_kv at this config.

Regenerate (any PyTorch; the file is committed, CI never runs this):
    python3 tests/reference/make_llama_reference.py
Made with torch 2.15 on CPU, one thread (a virtual environment from the
package index; Debian's python3-torch 1.13 runs it too).
"""
import os

import torch

from make_reference import save_safetensors
from torch_gpt import loss_fn
from torch_llama import Llama, LlamaConfig, adamw_param_groups, init_weights

CFG = LlamaConfig(vocab_size=65, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, mlp_hidden=88,
                  rope_base=500000.0, norm_eps=1e-5)
B, T = 4, 16
LR, BETAS, EPS, WEIGHT_DECAY, STEPS = 1e-3, (0.9, 0.999), 1e-8, 0.1, 10
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_reference.safetensors")


def main():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    model = Llama(CFG)
    init_weights(model, gen)
    idx = torch.randint(0, CFG.vocab_size, (B, T), generator=gen)
    targets = torch.randint(0, CFG.vocab_size, (B, T), generator=gen)
    targets[3, T - 2:] = -100

    params = list(model.named_parameters())
    weights = [(name, p.detach().clone()) for name, p in params]
    logits = model(idx)
    loss = loss_fn(logits, targets)
    loss.backward()
    grads = [("grad." + name, p.grad.detach().clone()) for name, p in params]

    opt = torch.optim.AdamW(adamw_param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss = loss_fn(model(idx), targets)
        losses.append(step_loss.item())
        step_loss.backward()
        opt.step()
    assert losses[0] == loss.item()

    metadata = {k: str(getattr(CFG, k)) for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head",
                                                  "n_embd", "mlp_hidden", "rope_base", "norm_eps")}
    metadata.update({
        "arch": "llama", "batch": f"{B}x{T}", "ignore_index": "-100",
        "adamw": f"lr={LR} betas={BETAS[0]},{BETAS[1]} eps={EPS} weight_decay={WEIGHT_DECAY} "
                 "on every matrix but wte, 0 elsewhere; loss recorded before each step",
        "generated_by": f"tests/reference/make_llama_reference.py, torch {torch.__version__}, float32, 1 thread",
    })
    tensors = weights + [("idx", idx), ("targets", targets), ("logits", logits), ("loss", loss)] + grads
    tensors.append(("adamw_losses", torch.tensor(losses, dtype=torch.float32)))
    save_safetensors(OUT, tensors, metadata)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes): {len(weights)} parameters "
          f"({sum(t.numel() for _, t in weights)} values), loss {loss.item():.6f}, "
          f"adamw_losses {losses[0]:.6f} -> {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
