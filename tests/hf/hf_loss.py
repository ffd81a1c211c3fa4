"""transformers reads folders loom exported: for each DIR prints the loss of
AutoModelForCausalLM.from_pretrained(DIR) (eval mode: GPT2LMHeadModel or
LlamaForCausalLM, as DIR/config.json says) on REFERENCE's input_ids and
targets, as JSON, for tests/test_hf_checkpoint.cpp and test_hf_llama.cpp to
compare with loom's.
  hf_loss.py REFERENCE DIR...  ->  {"folder": "DIR", "loss": 4.123456789} per line
"""
import json
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main(reference, *folders):
    ref = load_file(reference)
    for folder in folders:
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        with torch.no_grad():
            logits = model(ref["input_ids"]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ref["targets"].reshape(-1))
        print(json.dumps({"folder": folder, "loss": loss.item()}))


if __name__ == "__main__":
    main(*sys.argv[1:])
