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
import sys

from make_llama import write_references  # the same small models and reference files, another architecture
from transformers import MixtralConfig, MixtralForCausalLM

MODELS = {
    "mixtral-top2": dict(num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2, tie_word_embeddings=False),
    "mixtral-top1": dict(num_local_experts=3, num_experts_per_tok=1, num_key_value_heads=1, tie_word_embeddings=True,
                         rope_theta=10000.0, rms_norm_eps=1e-6),
}


def main(corpus, out):
    write_references(corpus, out, MixtralConfig, MixtralForCausalLM, MODELS, "mixtral-top2", "40kB")


if __name__ == "__main__":
    main(*sys.argv[1:])
