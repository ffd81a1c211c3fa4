"""The Mixtral reference for tests/test_hf_mixtral.cpp: transformers' own MixtralForCausalLM.

  make_mixtral.py CORPUS OUT
builds small Mixtrals (2 layers, hidden 32, 4 heads, each expert's intermediate
48, max_position_embeddings 16, a vocabulary of the corpus's distinct
characters) with random weights - every parameter, the router's included, drawn
N(0, 0.2), so a swapped expert, a w1/w3 mix-up or another top-k changes the
logits - and writes, for each NAME below,
  OUT/NAME/                    save_pretrained: config.json + model.safetensors
  OUT/NAME.reference.safetensors  input_ids, targets [2, 16] int64, logits
                               [2, 16, V] fp32 and loss [1] (mean cross-entropy,
                               eval mode)
and OUT/mixtral-top2-sharded/ (save_pretrained(max_shard_size=40kB) of mixtral-top2).
  mixtral-top2  4 experts, 2 per token (Mixtral's routing), 2 kv heads, untied lm_head, rope_theta 1e6 (the default)
  mixtral-top1  3 experts, 1 per token (Switch's), 1 kv head, tied embeddings, rope_theta 10000, rms_norm_eps 1e-6
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import MixtralConfig, MixtralForCausalLM

MODELS = {
    "mixtral-top2": dict(num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2, tie_word_embeddings=False),
    "mixtral-top1": dict(num_local_experts=3, num_experts_per_tok=1, num_key_value_heads=1, tie_word_embeddings=True,
                         rope_theta=10000.0, rms_norm_eps=1e-6),
}


def main(corpus, out):
    text = open(corpus, encoding="utf-8").read()
    vocab = len(set(text))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 16), generator=g)
    targets = torch.randint(0, vocab, (2, 16), generator=g)
    for seed, (name, options) in enumerate(MODELS.items()):
        torch.manual_seed(seed)
        cfg = MixtralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=16, bos_token_id=None, eos_token_id=None,
                            **options)
        model = MixtralForCausalLM(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.2)
        model.save_pretrained(os.path.join(out, name))
        if name == "mixtral-top2":
            model.save_pretrained(os.path.join(out, name + "-sharded"), max_shard_size="40kB")
        with torch.no_grad():
            logits = model(ids).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        save_file({"input_ids": ids, "targets": targets, "logits": logits.contiguous(), "loss": loss.reshape(1)},
                  os.path.join(out, name + ".reference.safetensors"))
        print(f"{name} reference: vocab {vocab}, loss {loss.item():.6f} -> {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
