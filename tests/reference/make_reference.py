#!/usr/bin/python3
"""Writes tests/reference/gpt_reference.safetensors: a PyTorch reference for loom's GPT.

llm.c style: PyTorch builds the same GPT as loom's nn/gpt.h (torch_gpt.py beside
this file, shared with bench/gpt_step.py: GPT-2 architecture, nanoGPT's
parameter names, pre-LN, tanh GELU, plain matmul attention, LM head tied to
wte, float32), initialises it, runs one batch forward and backward,
then takes 10 AdamW steps on that batch. Everything the C++ tests compare
against goes into one safetensors file (written by hand: struct + json, no
safetensors package needed):

  <name>            every parameter, loom's names, named_parameters() order
  idx, targets      the batch, int64 [4, 16]; targets[3, 14:] = -100 (ignored)
  logits            float32 [4, 16, 65]
  loss              float32 [], mean cross-entropy over the 62 counted tokens
  grad.<name>       d loss / d <name> (wte's includes the tied LM head's part)
  adamw_losses      float32 [10], the loss before each of 10 AdamW steps
                    (torch.optim.AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8,
                    weight_decay 0.1 on Linear weights only: attn.c_attn,
                    attn.c_proj, mlp.c_fc, mlp.c_proj; 0 for biases, LayerNorm
                    and the embeddings)
  __metadata__      the config and the optimizer settings, as strings

Config: vocab 65, block 16, n_layer 2, n_head 2, n_embd 32, dropout 0; the
weights come from torch.Generator().manual_seed(0) (loom's own Generator is not
involved: the test loads these weights).

Regenerate (Debian's python3-torch; the file is committed, CI never runs this):
    /usr/bin/python3 tests/reference/make_reference.py
Made with torch 1.13 on CPU, one thread.
"""
import json
import os
import struct

import torch

from torch_gpt import GPT, GPTConfig, adamw_param_groups, init_gpt2, loss_fn

VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD = 65, 16, 2, 2, 32
B, T = 4, 16
SEED = 0
LR, BETAS, EPS, WEIGHT_DECAY, STEPS = 1e-3, (0.9, 0.999), 1e-8, 0.1, 10
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_reference.safetensors")


DTYPES = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}


def save_safetensors(path, tensors, metadata):
    """safetensors by hand: u64 header length, JSON header padded to 8 bytes, raw little-endian data."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors:
        dtype, np_dtype = DTYPES[t.dtype]
        data = t.detach().contiguous().numpy().astype(np_dtype).tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(path + ".tmp", path)


def main():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD))
    init_gpt2(model, gen)
    idx = torch.randint(0, VOCAB, (B, T), generator=gen)
    targets = torch.randint(0, VOCAB, (B, T), generator=gen)
    targets[3, T - 2:] = -100  # exercise ignore_index

    params = list(model.named_parameters())
    weights = [(name, p.detach().clone()) for name, p in params]

    # One forward and backward from the initial weights.
    logits = model(idx)
    loss = loss_fn(logits, targets)
    loss.backward()
    grads = [("grad." + name, p.grad.detach().clone()) for name, p in params]

    # 10 AdamW steps on the same batch, from the same initial weights.
    opt = torch.optim.AdamW(adamw_param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss = loss_fn(model(idx), targets)
        losses.append(step_loss.item())
        step_loss.backward()
        opt.step()
    assert losses[0] == loss.item()

    metadata = {
        "vocab_size": str(VOCAB), "block_size": str(BLOCK), "n_layer": str(N_LAYER), "n_head": str(N_HEAD),
        "n_embd": str(N_EMBD), "dropout": "0", "batch": f"{B}x{T}", "ignore_index": "-100",
        "adamw": f"lr={LR} betas={BETAS[0]},{BETAS[1]} eps={EPS} weight_decay={WEIGHT_DECAY} "
                 "on attn.c_attn/attn.c_proj/mlp.c_fc/mlp.c_proj weights, 0 elsewhere; loss recorded before each step",
        "generated_by": f"tests/reference/make_reference.py, torch {torch.__version__}, float32, 1 thread",
    }
    tensors = weights + [("idx", idx), ("targets", targets), ("logits", logits), ("loss", loss)] + grads
    tensors.append(("adamw_losses", torch.tensor(losses, dtype=torch.float32)))
    save_safetensors(OUT, tensors, metadata)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes): {len(weights)} parameters "
          f"({sum(t.numel() for _, t in weights)} values), loss {loss.item():.6f}, "
          f"adamw_losses {losses[0]:.6f} -> {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
