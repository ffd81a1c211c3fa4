"""The reference for tests/test_hf_checkpoint.cpp: transformers' own GPT2LMHeadModel.

  make_gpt2.py CORPUS OUT
builds a small GPT-2 (2 layers, n_embd 32, 4 heads, n_positions 16, dropout 0,
a vocabulary of the corpus's distinct characters, as loom's char tokenizer
counts them at most) with random weights - every parameter, layernorms included,
drawn N(0, 0.2), so a swapped or untransposed tensor changes the logits - and
writes
  OUT/gpt2/          save_pretrained: config.json + model.safetensors
  OUT/gpt2-sharded/  save_pretrained(max_shard_size=20 kB): shards + index
  OUT/reference.safetensors  input_ids, targets [2, 16] int64, logits [2, 16, V]
                             fp32 and loss [1]: mean cross-entropy of the logits
                             against targets, the model in eval mode
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel


def main(corpus, out):
    text = open(corpus, encoding="utf-8").read()
    vocab = len(set(text))
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(os.path.join(out, "gpt2"))
    model.save_pretrained(os.path.join(out, "gpt2-sharded"), max_shard_size="20kB")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 16), generator=g)
    targets = torch.randint(0, vocab, (2, 16), generator=g)
    with torch.no_grad():
        logits = model(ids).logits
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    save_file({"input_ids": ids, "targets": targets, "logits": logits.contiguous(), "loss": loss.reshape(1)},
              os.path.join(out, "reference.safetensors"))
    print(f"gpt2 reference: vocab {vocab}, loss {loss.item():.6f} -> {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
