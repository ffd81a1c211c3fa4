"""Folders a current transformers (5.x) writes, committed as tests/hf/fixtures/ so
that tests/test_hf_fixtures.cpp checks loom against them with no Python.

  make_fixtures.py OUT [NAME...]   (OUT: tests/hf/fixtures; how to make the venv: tests/hf/README.md;
                                    NAMEs: only those models, leaving the others' files as they are)

For each NAME below: a small random model (every parameter drawn N(0, 0.2), so a
swapped, transposed or mis-cut tensor changes the logits), saved with
save_pretrained as OUT/NAME/ (sharded ones as OUT/NAME-sharded/ too), and
OUT/NAME.reference.safetensors: input_ids and targets [2, T] int64, the logits
[2, T, V] fp32 and the loss [1] the model gives in eval mode (in fp32: a bf16
folder's logits are those of its rounded weights, computed in fp32, as loom
computes). OUT/VERSIONS names the packages that wrote them. Shapes are odd on
purpose (vocab 37, 3 or 6 heads, head dims 4 and 8, MLP widths 36 and 40), and
a few kB each.
  gpt2-odd     GPT-2, 3 heads of 8, n_positions 12; also sharded
  llama-gqa    6 heads of 4, 2 kv heads, rope_theta 500000, untied, rms_norm_eps 1e-5; also sharded
  llama-mqa    3 heads of 8, 1 kv head, rope_theta 10000 (the default), tied
  llama-bf16   llama-gqa's shape, rope_theta 1000000, saved in bfloat16 ("dtype": "bfloat16")
  mixtral-top2 MixtralForCausalLM: 4 experts of width 20, 2 per token, 6 heads of 4, 2 kv heads, untied; also
               sharded (5.x holds the experts fused in memory and writes them per expert, as 4.x did)
  mixtral-top1 3 experts of width 36, 1 per token, 3 heads of 8, 1 kv head, tied, rope_theta 10000
"""
import os
import platform
import sys

import safetensors
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

V, T = 37, 12
LLAMA = dict(vocab_size=V, max_position_embeddings=T, num_hidden_layers=2, bos_token_id=None, eos_token_id=None)
MODELS = {
    "gpt2-odd": (GPT2LMHeadModel, GPT2Config(vocab_size=V, n_positions=T, n_embd=24, n_layer=2, n_head=3,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                             bos_token_id=None, eos_token_id=None)),
    "llama-gqa": (LlamaForCausalLM, LlamaConfig(hidden_size=24, intermediate_size=40, num_attention_heads=6,
                                                num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-5,
                                                tie_word_embeddings=False, **LLAMA)),
    "llama-mqa": (LlamaForCausalLM, LlamaConfig(hidden_size=24, intermediate_size=36, num_attention_heads=3,
                                                num_key_value_heads=1, tie_word_embeddings=True, **LLAMA)),
    "llama-bf16": (LlamaForCausalLM, LlamaConfig(hidden_size=24, intermediate_size=40, num_attention_heads=6,
                                                 num_key_value_heads=2, rope_theta=1000000.0,
                                                 tie_word_embeddings=False, **LLAMA)),
    "mixtral-top2": (MixtralForCausalLM, MixtralConfig(hidden_size=24, intermediate_size=20, num_attention_heads=6,
                                                       num_key_value_heads=2, num_local_experts=4,
                                                       num_experts_per_tok=2, tie_word_embeddings=False, **LLAMA)),
    "mixtral-top1": (MixtralForCausalLM, MixtralConfig(hidden_size=24, intermediate_size=36, num_attention_heads=3,
                                                       num_key_value_heads=1, num_local_experts=3,
                                                       num_experts_per_tok=1, rope_theta=10000.0,
                                                       tie_word_embeddings=True, **LLAMA)),
}
SHARDED = {"gpt2-odd", "llama-gqa", "mixtral-top2"}


def main(out, *only):
    assert int(transformers.__version__.split(".")[0]) >= 5, \
        f"transformers {transformers.__version__}: these fixtures are what transformers 5 writes"
    os.makedirs(out, exist_ok=True)
    versions = (f"python {platform.python_version()}, torch {torch.__version__}, transformers "
                f"{transformers.__version__}, safetensors {safetensors.__version__}\n")
    if only:  # the other fixtures stay: they must have been written by the same versions
        with open(os.path.join(out, "VERSIONS")) as f:
            assert f.read() == versions, f"{out}/VERSIONS is not '{versions.strip()}': regenerate every fixture"
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (2, T), generator=g)
    targets = torch.randint(0, V, (2, T), generator=g)
    for seed, (name, (cls, cfg)) in enumerate(MODELS.items()):
        if only and name not in only:
            continue
        torch.manual_seed(seed)
        model = cls(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.2)
        if name.endswith("bf16"):
            model = model.to(torch.bfloat16)
        model.save_pretrained(os.path.join(out, name))
        if name in SHARDED:
            model.save_pretrained(os.path.join(out, name + "-sharded"), max_shard_size="20kB")
        with torch.no_grad():
            logits = model.float()(ids).logits
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        save_file({"input_ids": ids, "targets": targets, "logits": logits.contiguous(), "loss": loss.reshape(1)},
                  os.path.join(out, name + ".reference.safetensors"))
        print(f"{name}: loss {loss.item():.6f}")
    if not only:
        with open(os.path.join(out, "VERSIONS"), "w") as f:
            f.write(versions)


if __name__ == "__main__":
    main(*sys.argv[1:])
