#include "plan/check_plan.h"

#include <cmath>
#include <string>

#include "parallel/context_parallel/zigzag.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/tensor_parallel/gpt.h"
#include "tensor/error.h"

namespace loom::plan {

namespace {

// "--flag must be in [lo, hi], got v", as train_gpt words it.
void check_range(const char* flag, int64_t v, int64_t lo, int64_t hi, const char* why = "") {
  LOOM_CHECK(v >= lo && v <= hi, flag, " must be in [", lo, ", ", hi, "]", why, ", got ", v);
}

}  // namespace

void check_plan(const ModelShape& m, const Grid& g, const Batch& b) {
  constexpr int64_t kMaxSize = int64_t(1) << 20;
  check_range("--layers", m.layers, 1, 4096);
  check_range("--embd", m.width, 1, kMaxSize);
  check_range("--heads", m.heads, 1, 4096);
  check_range("--vocab", m.vocab, 1, kMaxSize);
  check_range("--block", m.seq, 1, kMaxSize);
  check_range("--batch", b.micro_batch, 1, kMaxSize, " (sequences per micro-batch per dp rank)");
  check_range("--microbatches", b.micro_batches, 1, kMaxSize);
  check_range("--dp", g.dp, 1, 65536);
  check_range("--pp", g.pp, 1, 65536);
  check_range("--tp", g.tp, 1, 65536);
  check_range("--virtual-stages", g.virtual_stages, 1, 4096);
  check_range("--cp", g.cp, 1, 65536);
  parallel::check_zigzag_split(m.seq, g.cp);
  LOOM_CHECK(m.width % m.heads == 0, "--embd ", m.width, " must be divisible by --heads ", m.heads);
  const int64_t kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  LOOM_CHECK(m.kv_heads >= 0 && m.heads % kv == 0, "--kv-heads ", m.kv_heads, " must divide --heads ", m.heads);
  parallel::check_tensor_parallel_split(parallel::TensorParallelSizes{m.heads, kv, m.ffn_width(), m.seq}, g.tp,
                                       g.sequence_parallel);
  LOOM_CHECK(!g.sequence_parallel || g.tp > 1, "--sequence-parallel needs --tp > 1");
  check_range("--ep", g.ep, 1, 65536);
  if (m.experts > 0) {  // a mixture of experts (plan/moe_model.h): train_gpt's rules, and the ep grid's
    LOOM_CHECK(m.llama, "--experts ", m.experts, " with --arch gpt2: the experts are SwiGLU MLPs; use --arch llama");
    check_range("--experts-per-token", m.experts_per_token, 1, m.experts, " (each token goes to k different experts)");
    LOOM_CHECK(m.experts % g.ep == 0 && g.dp % g.ep == 0, "--ep ", g.ep, " splits the ", m.experts, " experts over ep "
               "of the ", g.dp, " dp ranks: it must divide both --experts and --dp");
    LOOM_CHECK(g.ep == 1 || g.dp_shard == 0 || g.dp_shard % g.ep == 0, "--ep ", g.ep, " with --dp-shard ", g.dp_shard,
               ": the ep group is ep consecutive ranks of one shard group, so --ep must divide --dp-shard");
  }
  LOOM_CHECK(g.ep == 1 || m.experts > 0, "--ep ", g.ep, " splits experts over ranks; it needs --experts E");
  // train_gpt's rules: a capacity counts a micro-batch's tokens in order, which cp and SP split over ranks.
  LOOM_CHECK(m.capacity_factor == 0 || (m.experts > 0 && std::isfinite(m.capacity_factor) && m.capacity_factor > 0),
             "--capacity-factor ", m.capacity_factor, " caps each expert's rows: it needs --experts E and a factor > 0");
  LOOM_CHECK(m.capacity_factor == 0 || (g.cp == 1 && !g.sequence_parallel), "--capacity-factor ", m.capacity_factor,
             " with ", g.cp > 1 ? "--cp " + std::to_string(g.cp) : std::string("--sequence-parallel"),
             ": the micro-batch's tokens are split over ranks, and which ones an expert drops depends on all of them "
             "in order (train_gpt refuses it too)");
  LOOM_CHECK(m.layers + 2 >= int64_t(g.pp) * g.virtual_stages, "--pp ", g.pp, " x --virtual-stages ",
             g.virtual_stages, " exceeds the ", m.layers + 2, " layers (embedding + blocks + head)");
  if (parallel::schedule_chunk_layout(g.schedule) == parallel::ChunkLayout::V) {  // ZB-V, DualPipeV: train_gpt's rules
    LOOM_CHECK(g.virtual_stages == 2 && g.pp >= 2, "--schedule ", g.schedule, " lays two chunks on every rank in a V; "
               "it needs --virtual-stages 2 and --pp >= 2 (got --virtual-stages ", g.virtual_stages, " --pp ", g.pp, ")");
    LOOM_CHECK(g.schedule != "dualpipev" || b.micro_batches >= 2 * g.pp, "--schedule dualpipev needs at least 2 pp "
               "micro-batches, got ", b.micro_batches, " for pp ", g.pp);
  } else if (g.virtual_stages > 1) {  // interleaved 1F1B: train_gpt's rules
    LOOM_CHECK(g.pp >= 2, "--virtual-stages ", g.virtual_stages,
               " interleaves the chunks of a pipeline; it needs --pp >= 2");
    LOOM_CHECK(g.schedule == "1f1b", "--virtual-stages ", g.virtual_stages, " runs interleaved 1F1B; --schedule ",
               g.schedule, " has no interleaved form");
    LOOM_CHECK(b.micro_batches % g.pp == 0, "--virtual-stages ", g.virtual_stages, ": interleaved 1F1B needs "
               "--microbatches a multiple of --pp (Megatron's rule), got ", b.micro_batches, " micro-batches for pp ",
               g.pp);
  }
}

void check_efficiency(double efficiency) {
  LOOM_CHECK(std::isfinite(efficiency) && efficiency >= 0 && efficiency <= 1, "--efficiency ", efficiency,
             " must be a fraction of the peak in (0, 1] (0: the machine's own)");
}

}  // namespace loom::plan
