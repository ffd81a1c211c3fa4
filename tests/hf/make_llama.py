"""The Llama reference for tests/test_hf_llama.cpp: transformers' own LlamaForCausalLM.

  make_llama.py CORPUS OUT
builds small Llamas (2 layers, hidden 32, 4 heads, intermediate 48,
max_position_embeddings 16, a vocabulary of the corpus's distinct characters)
with random weights - every parameter, the RMSNorm weights included, drawn
N(0, 0.2), so a swapped, transposed or mis-cut q/k/v changes the logits - and
writes, for each NAME below,
  OUT/NAME/                    save_pretrained: config.json + model.safetensors
  OUT/NAME.reference.safetensors  input_ids, targets [2, 16] int64, logits
                               [2, 16, V] fp32 and loss [1] (mean cross-entropy,
                               eval mode)
and OUT/llama-gqa2-sharded/ (save_pretrained(max_shard_size=20kB) of llama-gqa2).
  llama-gqa2  2 kv heads (grouped-query), rope_theta 500000, untied lm_head, rms_norm_eps 1e-5
  llama-mqa   1 kv head (multi-query), rope_theta 10000, tied embeddings, rms_norm_eps 1e-6 (the default)
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

MODELS = {
    "llama-gqa2": dict(num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False, rms_norm_eps=1e-5),
    "llama-mqa": dict(num_key_value_heads=1, rope_theta=10000.0, tie_word_embeddings=True),
}


def write_references(corpus, out, config_class, model_class, models, sharded, max_shard_size):
    """Each of models {NAME: config options} built small, drawn N(0, 0.2), saved with its reference
    (the layout above); sharded: the NAME also saved in shards of max_shard_size. make_mixtral.py shares it."""
    text = open(corpus, encoding="utf-8").read()
    vocab = len(set(text))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 16), generator=g)
    targets = torch.randint(0, vocab, (2, 16), generator=g)
    for seed, (name, options) in enumerate(models.items()):
        torch.manual_seed(seed)
        cfg = config_class(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=16, bos_token_id=None, eos_token_id=None,
                           **options)
        model = model_class(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.2)
        model.save_pretrained(os.path.join(out, name))
        if name == sharded:
            model.save_pretrained(os.path.join(out, name + "-sharded"), max_shard_size=max_shard_size)
        with torch.no_grad():
            logits = model(ids).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        save_file({"input_ids": ids, "targets": targets, "logits": logits.contiguous(), "loss": loss.reshape(1)},
                  os.path.join(out, name + ".reference.safetensors"))
        print(f"{name} reference: vocab {vocab}, loss {loss.item():.6f} -> {out}")


def main(corpus, out):
    write_references(corpus, out, LlamaConfig, LlamaForCausalLM, MODELS, "llama-gqa2", "20kB")


if __name__ == "__main__":
    main(*sys.argv[1:])
