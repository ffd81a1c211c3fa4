"""The reference for loom's BpeTokenizer (data/bpe_tokenizer.h): the
`tokenizers` package trains a byte-level BPE on the corpus and encodes texts.
  make_tokenizer.py CORPUS OUT
writes OUT/tokenizer.json (vocabulary 300, GPT-2's pre-tokenizer) and
OUT/tokenizer_reference.json: {"texts": [...], "ids": [[...], ...]}, the
corpus itself first, then strings that exercise each branch of GPT-2's
pattern (contractions, runs of spaces and newlines, digits, punctuation,
non-ASCII letters, numbers and symbols).
"""
import json
import os
import sys

from tokenizers import ByteLevelBPETokenizer


def main(corpus, out):
    text = open(corpus, encoding="utf-8").read()
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([text], vocab_size=300, min_frequency=2, show_progress=False)
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    texts = [text,
             "Hello  world's  they'll\n\n  x 123 4.5 'quoted' don't I'M we've you'd",
             "   leading and trailing   \n\t\ttabs\r\n",
             "\u00fcn\u00efc\u00f6d\u00e9 \u00bd \u20ac5 na\u00efve \u2014 dash \u00d7 \u65e5\u672c\u8a9e \U0001F600!",
             "a\u00a0b  ?!  ''s 's"]
    ids = [tok.encode(t).ids for t in texts]
    with open(os.path.join(out, "tokenizer_reference.json"), "w") as f:
        json.dump({"texts": texts, "ids": ids}, f)
    print(f"tokenizer reference: vocab {tok.get_vocab_size()}, corpus {len(ids[0])} tokens -> {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
