#include "train/corpus.h"

#include <algorithm>
#include <optional>

#include "nn/hf_config.h"
#include "optim/checkpoint.h"
#include "parallel/comm/handshake.h"
#include "train/say.h"

namespace loom::train {

Corpus load_corpus(const Args& a, parallel::ProcessGroup& world) {
  const bool rank0 = world.rank() == 0;
  data::CorpusStats read;
  std::u32string text = data::read_corpus(a.data, &read);
  std::string vocab;
  nn::GPTConfig cfg = model_config(a);
  if (!a.resume.empty()) {
    const std::string flags_arch = cfg.arch();  // "custom" for --arch gpt2 --untied, as its checkpoint says
    cfg = optim::load_config(a.resume, &vocab);  // the checkpoint's architecture wins
    apply_moe_flags(cfg, a, "the checkpoint --resume " + a.resume);  // its experts; the flags' routing options
    // ... so an --arch that is not the checkpoint's would be ignored, silently.
    LOOM_CHECK(!a.arch_given || cfg.arch() == flags_arch, "--arch ", a.arch,
               flags_arch == a.arch ? "" : " (with --untied or --kv-heads: a " + flags_arch + " model)",
               ", but the checkpoint --resume ", a.resume, " holds a ", cfg.arch(),
               " model, and a resume trains the checkpoint's architecture; drop --arch",
               cfg.arch() == "custom" ? "" : " or pass --arch " + cfg.arch());
    say(rank0, "resume: %s (the checkpoint's config: %lld layers, %lld heads, %lld embd, block %lld)\n",
        a.resume.c_str(), (long long)cfg.n_layer, (long long)cfg.n_head, (long long)cfg.n_embd,
        (long long)cfg.block_size);
  }
  if (!a.init_from.empty()) {  // the folder's model (--seed still draws the dropout masks)
    cfg = nn::read_hf_config(a.init_from + "/config.json");
    cfg.seed = a.seed;
    apply_moe_flags(cfg, a, "--init-from " + a.init_from);
  }
  say(rank0 && a.tokenizer_from_init, "tokenizer: %s (--init-from's own; --tokenizer FILE picks another)\n",
      a.tokenizer.c_str());
  Tokenizer tok = make_tokenizer(a, text, vocab);  // characters, or --tokenizer's BPE
  if (a.init_from.empty()) cfg.vocab_size = tok.vocab_size();
  LOOM_CHECK(!tok.bpe || tok.vocab_size() == cfg.vocab_size, "--tokenizer ", a.tokenizer, " has ", tok.vocab_size(),
             " tokens, but the model's vocab_size is ", cfg.vocab_size, " (--init-from ", a.init_from,
             "/config.json); the ids and the embedding's rows must be the same vocabulary");
  LOOM_CHECK(tok.vocab_size() <= cfg.vocab_size, "--data ", a.data, " has ", tok.vocab_size(),
             " distinct characters, more than the vocab_size ", cfg.vocab_size, " of --init-from ", a.init_from,
             "/config.json: its ids would fall outside the embedding");
  LOOM_CHECK(tok.vocab_size() == cfg.vocab_size || a.sample == 0, "--init-from ", a.init_from, ": vocab_size ",
             cfg.vocab_size, " is more than the ", tok.vocab_size(), " characters of --data ", a.data,
             ", so the sample at the end could draw ids the character tokenizer cannot print; pass --sample 0");
  int64_t eod = -1;
  if (!a.eod_mask_loss.empty()) {
    const std::u32string eod_text = data::decode_utf8(a.eod_mask_loss, "--eod-mask-loss");
    const bool known = tok.bpe || std::all_of(eod_text.begin(), eod_text.end(), [&](char32_t c) {
      return text.find(c) != std::u32string::npos;
    });
    LOOM_CHECK(known, "--eod-mask-loss '", a.eod_mask_loss, "': a character of it is not in --data ", a.data,
               ", so the token never occurs");
    const std::vector<int32_t> ids = tok.encode(eod_text);
    LOOM_CHECK(ids.size() == 1, "--eod-mask-loss '", a.eod_mask_loss, "' is ", ids.size(), " ", tok.unit(),
               ", not one token: give the end-of-document token's text");
    eod = ids[0];
  }
  // The data handshake: every rank must read the same text (so the same vocabulary and batches).
  const std::string utf8 = data::encode_utf8(text);
  parallel::check_ranks_agree(world,
                              {{"corpus bytes", std::to_string(utf8.size())},
                               {"corpus hash (FNV-1a)", parallel::fingerprint(utf8.data(), utf8.size())},
                               {"vocabulary size", std::to_string(tok.vocab_size())},
                               {"tokenizer", tok.bpe ? tok.record() : "characters"}},
                              "data (--data " + a.data + ")");
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text);
  } catch (const Error& e) {  // only with --resume: the checkpoint's vocabulary lacks a character of this corpus
    throw Error(str("--data ", a.data, " does not fit the vocabulary of the checkpoint --resume ", a.resume, ": ",
                    e.what(), "; resume with the corpus the checkpoint was trained on"));
  }
  std::optional<data::TextDataset> ds;
  try {
    ds.emplace(std::move(ids), cfg.block_size);
  } catch (const Error& e) {  // a corpus too short for one block: name the file
    throw Error(str("--data ", a.data, ": ", e.what()));
  }
  say(rank0, "data: %s, %lld train / %lld val tokens%s, vocab %lld%s%s\n", a.data.c_str(),
      (long long)ds->train_tokens(), (long long)ds->val_tokens(), ds->val_note().c_str(), (long long)tok.vocab_size(),
      tok.bpe ? str(" (BPE ", a.tokenizer, ")").c_str() : "", data::dropped_note(read).c_str());
  return Corpus{std::move(tok), std::move(*ds), cfg, eod};
}

}  // namespace loom::train
