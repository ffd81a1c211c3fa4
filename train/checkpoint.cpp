#include "train/checkpoint.h"

#include <unistd.h>

#include <cstdio>

#include "nn/hf_checkpoint.h"
#include "nn/hf_config.h"
#include "optim/model_checkpoint.h"
#include "parallel/comm/watchdog.h"
#include "parallel/load_full_state.h"
#include "train/say.h"

namespace loom::train {

// "GPT-2", "Llama" or "Mixtral": the transformers class family of cfg, as the log names it.
static std::string family_title(const nn::GPTConfig& cfg) {
  const std::string f = nn::hf_family(cfg);
  return f == "gpt2" ? "GPT-2" : f == "llama" ? "Llama" : "Mixtral";
}

void init_from_hf(const Args& a, parallel::Model& m, parallel::ProcessGroupManager& pgm) {
  if (a.init_from.empty()) return;
  const nn::HfCheckpoint hf = nn::load_hf_checkpoint(a.init_from);  // every rank reads it: no communication
  parallel::load_full_state(m, hf.state);                          // its stage's layers, its tp shards
  say(pgm.global_rank == 0, "init: %s (Hugging Face %s, vocab %lld)\n", a.init_from.c_str(),
      family_title(hf.cfg).c_str(), (long long)hf.cfg.vocab_size);
}

void export_hf(const Args& a, const Corpus& c, parallel::Model& m, optim::MixedPrecisionOptimizer& opt,
               parallel::ProcessGroupManager& pgm) {
  if (a.export_hf.empty()) return;
  // The last step's params, whole: ZeRO-1/2's all-gathers may still be writing
  // them (--overlap-param-gather waits in the next forward), ZeRO-3 keeps only shards.
  opt.finish_param_sync();
  const nn::NamedTensors state = parallel::gather_full_state(m, pgm);  // collective; the whole GPT on rank 0
  if (pgm.global_rank != 0) return;
  parallel::watchdog::LocalWork writing(str("writing --export-hf ", a.export_hf));  // the disk may be slow (watchdog.h)
  nn::save_hf_checkpoint(a.export_hf, c.cfg, state, int64_t(a.export_hf_shard_mb * 1024 * 1024), a.tokenizer);
  std::printf("exported %s (Hugging Face %s%s)\n", a.export_hf.c_str(),
              family_title(c.cfg).c_str(),
              a.export_hf_shard_mb > 0 ? str(", shards of at most ", a.export_hf_shard_mb, " MiB").c_str() : "");
}

int64_t resume(const Args& a, optim::MixedPrecisionOptimizer& opt, parallel::Model& m, Generator& data_gen) {
  if (a.resume.empty()) return 0;
  const optim::TrainState s = optim::load_model_checkpoint(a.resume, m, opt);
  LOOM_CHECK(s.step <= a.steps, "--steps ", a.steps, " is below the step of the checkpoint --resume ", a.resume, " (",
             s.step, " steps done); to train further pass --steps > ", s.step);
  LOOM_CHECK(a.stop_at == 0 || s.step <= a.stop_at, "--stop-at ", a.stop_at, " is below the step of the checkpoint "
             "--resume ", a.resume, " (", s.step, " steps done): a save would label step ", s.step, "'s state as step ",
             a.stop_at, "; pass --stop-at >= ", s.step);
  if (!s.router_biases_missing.empty())
    say(true, "resume: %s has no routing biases (%s ...; saved without --router-bias-update-rate): they start at 0\n",
        a.resume.c_str(), s.router_biases_missing.front().c_str());
  data_gen.set_state(s.data_rng);
  return s.step;
}

void save(const Args& a, int64_t steps_done, const Corpus& c, parallel::Model& m, optim::MixedPrecisionOptimizer& opt,
          const Generator& data_gen, parallel::ProcessGroupManager& pgm) {
  if (a.save.empty()) return;
  optim::save_model_checkpoint(a.save, m, opt, c.cfg, c.tok.record(), steps_done, data_gen.state(), pgm);
  say(pgm.global_rank == 0, "%ssaved %s (step %lld)\n", isatty(fileno(stdout)) ? "\n" : "", a.save.c_str(),
      (long long)steps_done);
}

}  // namespace loom::train
