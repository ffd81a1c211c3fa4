// bench_pipeline_memory: what 1F1B buys over all-forward-all-backward (GPipe),
// and interleaved 1F1B (--v chunks per stage) over 1F1B, measured, and how big
// the pipeline bubble really is.
//
// pp = the number of ranks; each rank is one stage of a GPT (balanced
// partition by parameter count). Each schedule runs the same steps of m
// micro-batches:
//   peak activation memory: the allocator's peak during a step minus what was
//     live before it (parameters, their .grad kept from a warm-up step so no
//     gradient is allocated inside the measured step, optimizer-free). That is
//     the saved activations, the backward's temporaries and the p2p buffers.
//     AFAB keeps all m micro-batches' activations alive on every stage; 1F1B at
//     most p - s on stage s. Target: 1F1B's peak <= (p / m) x AFAB's + 10%.
//   bubble: 1 - (time in F and B) / (step time), per stage, averaged (the
//     ScheduleEvent timestamps; schedule_diagram.h), beside the theory
//     (p - 1)/(m + p - 1), for v chunks (p - 1)/(v m + p - 1). Target: within 0.05. Ranks share the machine's
//     cores: with more stages than cores, stages that run at the same time
//     slow each other down, which the theory does not know about. Beside it
//     the busiest stage's (the paper's bubble rate): the formulas assume equal
//     stages, and a lighter stage's spare time (the V's stage 0: only the
//     embedding and the head) is in the mean but does not delay the step.
//     Of the fastest of the --steps steps: on a shared machine a step that
//     another process held up says more about that process than the schedule.
//   --simulate-ms F: every stage's forward also sleeps F ms and its backward
//     2F ms (bench/simulated_stage.h). Give it a tiny model (--embd 16) and the
//     stages take equal, fixed times without competing for cores - the
//     theory's premise, one device per stage - so the bubble measured is the
//     schedule's and the transfers' own, even with 4 stages on 2 cores.
//
// Usage: mpirun -np 2 build/bench/bench_pipeline_memory [--m 8] [--layers 8] [--embd 128]
//        [--heads 4] [--block 64] [--batch 4] [--steps 3] [--v 2] [--simulate-ms F] [--latency-ms C]
//        [--trace pipeline.json]
//   --latency-ms C: also replays each schedule's spans with every transfer
//     taking C (default F / 4, half of a V's chunk forward): the step time a
//     slow link would give, which DualPipeV's pairs hide more of than ZB-V.
// (--v 1 skips the interleaved run; m must be a multiple of pp for it.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "autograd/function.h"
#include "autograd/variable.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "bench/simulated_stage.h"
#include "parallel/comm/distributed.h"
#include "parallel/pipeline_parallel/dualpipev_schedule.h"
#include "parallel/pipeline_parallel/interleaved_schedule.h"
#include "parallel/pipeline_parallel/overlapped_pairs.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"
#include "parallel/pipeline_parallel/zbv_schedule.h"
#include "parallel/pipeline_parallel/zero_bubble_schedule.h"
#include "parallel/trace/trace.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

struct Measured {
  double peak_mb = 0;  // this stage's largest peak over the measured steps
  // Of the fastest measured step (the one other processes disturbed least; the same on every rank):
  double bubble = 0;   // mean over the stages
  double busiest = 0;  // the busiest stage's bubble (the paper's bubble rate)
  double slow_links_ms = 0;  // the same spans replayed with every transfer taking --latency-ms
  double step_ms = 1e300;  // the schedule's wall time (rank 0's clock)
  std::string diagram;  // the last step's --print-schedule text (pp rank 0)
};

Measured measure(const char* name, ModelChunks& stage, PipelineP2P& p2p, const std::vector<MicroBatch>& mbs,
                 int steps, double latency_ms) {
  const bool overlap = std::string(name) == "dualpipev --overlap-pairs";
  if (overlap) name = "dualpipev";
  auto schedule = std::string(name) == "afab"      ? train_step_pipeline_afab
                  : std::string(name) == "1f1b"    ? train_step_pipeline_1f1b
                  : std::string(name) == "zb-h1"   ? train_step_pipeline_zb_h1
                  : std::string(name) == "zb-v"    ? train_step_pipeline_zb_v
                  : std::string(name) == "dualpipev" ? nullptr
                                                   : train_step_pipeline_interleaved;
  LossFn loss_fn = [](const Tensor& logits, const Tensor& y) { return nn::cross_entropy_loss(logits, y); };
  std::vector<Tensor> params = stage.parameters();
  Measured out;
  for (int step = -1; step < steps; ++step) {  // step -1: warm-up, allocates every .grad
    autograd::zero_grad(params, /*set_to_none=*/false);
    p2p.pp_group().barrier();  // every stage starts together, as in a training loop after the optimizer step
    reset_peak_memory_stats();
    const int64_t live_before = memory_stats().live_bytes;
    const auto t0 = std::chrono::steady_clock::now();
    ForwardBackwardResult r = schedule ? schedule(stage, p2p, mbs, loss_fn, nullptr)
                                       : train_step_pipeline_dualpipev(stage, p2p, mbs, loss_fn, nullptr, overlap);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double peak = double(memory_stats().peak_bytes - live_before) / (1 << 20);
    std::vector<StageEvents> all = gather_schedule(p2p.pp_group(), r.events);
    if (step < 0) continue;
    out.peak_mb = std::max(out.peak_mb, peak);
    Tensor bubble = zeros({3}, kFloat64);
    if (p2p.pp_rank() == 0) {
      double first = 1e300, last = -1e300;  // the replay's times start at 0
      for (const StageEvents& evs : with_transfer_latency(all, latency_ms * 1000, schedule_chunk_layout(name)))
        for (const ScheduleEvent& e : evs) first = std::min(first, e.start_us), last = std::max(last, e.end_us);
      bubble = from_vector<double>({measured_bubble_fraction(all), busiest_stage_bubble_fraction(all),
                                    (last - first) / 1000});
    }
    p2p.pp_group().broadcast(bubble, 0);
    const std::vector<double> got = bubble.to_vector<double>();
    Tensor step_ms = full({}, ms, kFloat64);  // rank 0's, so every rank picks the same step
    p2p.pp_group().broadcast(step_ms, 0);
    if (step_ms.item<double>() < out.step_ms)
      out.step_ms = step_ms.item<double>(), out.bubble = got[0], out.busiest = got[1], out.slow_links_ms = got[2];
    if (step + 1 == steps) out.diagram = schedule_report(p2p.pp_group(), r.events, name);
  }
  return out;
}

// This rank's value on every rank, in rank order.
std::vector<double> gather(ProcessGroup& g, double v) {
  Tensor all = zeros({g.size()}, kFloat64);
  g.all_gather(all, full({1}, v, kFloat64));
  return all.to_vector<double>();
}

}  // namespace

int main(int argc, char** argv) {
  return parallel::run(argc, argv, [&] {
    int m = 8, steps = 3, v = 2;
    nn::GPTConfig cfg{64, 64, 8, 4, 128, 0.0, 1};
    int64_t batch = 4;
    double simulate_ms = 0, latency_ms = -1;
    std::string trace_path;
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string k = argv[i];
      int64_t value = std::atoll(argv[i + 1]);
      if (k == "--trace") trace_path = argv[i + 1];
      else if (k == "--m") m = int(value);
      else if (k == "--layers") cfg.n_layer = value;
      else if (k == "--embd") cfg.n_embd = value;
      else if (k == "--heads") cfg.n_head = value;
      else if (k == "--block") cfg.block_size = value;
      else if (k == "--batch") batch = value;
      else if (k == "--steps") steps = int(value);
      else if (k == "--v") v = int(value);
      else if (k == "--simulate-ms") simulate_ms = std::atof(argv[i + 1]);
      else if (k == "--latency-ms") latency_ms = std::atof(argv[i + 1]);
      else LOOM_CHECK(false, "bench_pipeline_memory: unknown option ", k);
    }
    if (latency_ms < 0) latency_ms = simulate_ms / 4;  // half of a V's chunk forward
    ops::set_num_threads(1);
    ProcessGroup& world = parallel::world();
    const int p = world.size();
    const auto simulated = std::chrono::microseconds(int64_t(simulate_ms * 1000));
    // This rank's stage: v chunks of a balanced partition into p v parts.
    auto make_stage = [&](int v, ChunkLayout layout = ChunkLayout::Interleaved) -> std::unique_ptr<ModelChunks> {
      std::vector<LayerRange> chunks =
          partition_balanced(gpt_layer_param_counts(cfg), p, v, layout)[size_t(world.rank())];
      if (simulate_ms > 0) return bench::simulated_stage(cfg, chunks, simulated);
      return std::make_unique<ModelChunks>(cfg, chunks);
    };
    std::unique_ptr<ModelChunks> stage = make_stage(1);
    const LayerRange range = stage->range();
    PipelineP2P p2p(world);

    Generator g(7);
    std::vector<MicroBatch> mbs;
    for (int i = 0; i < m; ++i)
      mbs.push_back({randint(0, cfg.vocab_size, {batch, cfg.block_size}, g),
                     randint(0, cfg.vocab_size, {batch, cfg.block_size}, g)});

    if (!trace_path.empty()) trace::start(world);
    Measured afab = measure("afab", *stage, p2p, mbs, steps, latency_ms);
    Measured ofob = measure("1f1b", *stage, p2p, mbs, steps, latency_ms);
    Measured zb = measure("zb-h1", *stage, p2p, mbs, steps, latency_ms);
    Measured inter;
    if (v > 1) {
      stage = make_stage(v);
      inter = measure("interleaved 1f1b", *stage, p2p, mbs, steps, latency_ms);
    }
    // The V (zbv_schedule.h): two chunks a rank, its own links (m >= 2p for DualPipeV).
    Measured zbv, dpv, dpv_overlap;
    {
      stage = make_stage(2, ChunkLayout::V);
      PipelineP2P v_links(world, ChunkLayout::V);
      zbv = measure("zb-v", *stage, v_links, mbs, steps, latency_ms);
      if (m >= 2 * p) dpv = measure("dualpipev", *stage, v_links, mbs, steps, latency_ms);
      if (m >= 2 * p) dpv_overlap = measure("dualpipev --overlap-pairs", *stage, v_links, mbs, steps, latency_ms);
    }
    if (!trace_path.empty()) trace::write(world, trace_path);
    std::vector<double> afab_mb = gather(world, afab.peak_mb), ofob_mb = gather(world, ofob.peak_mb);
    std::vector<double> inter_mb = gather(world, inter.peak_mb), zb_mb = gather(world, zb.peak_mb);
    std::vector<double> zbv_mb = gather(world, zbv.peak_mb), dpv_mb = gather(world, dpv.peak_mb);
    std::vector<double> first = gather(world, double(range.start)), last = gather(world, double(range.end));
    if (world.rank() != 0) return 0;

    std::printf("GPT %lld layers, %lld embd, %lld heads, block %lld, vocab %lld; micro-batch %lld; pp %d, m %d\n",
                (long long)cfg.n_layer, (long long)cfg.n_embd, (long long)cfg.n_head, (long long)cfg.block_size,
                (long long)cfg.vocab_size, (long long)batch, p, m);
    if (simulate_ms > 0)
      std::printf("simulated compute: every stage's F also sleeps %.2f ms, its B %.2f ms (a chunk 1/v of that)\n",
                  simulate_ms, 2 * simulate_ms);
    std::printf("\n");
    std::printf("%s\n%s\n%s\n%s\n%s\n%s\n", afab.diagram.c_str(), ofob.diagram.c_str(), zb.diagram.c_str(),
                inter.diagram.c_str(), zbv.diagram.c_str(), dpv.diagram.c_str());
    const double target = double(p) / double(m);
    std::printf("peak activation memory per stage (MB; 1f1b/afab, target <= p/m = %.3f, + 10%% = %.3f)\n", target,
                target * 1.1);
    std::printf("  stage  layers     afab     1f1b   1f1b/afab  in flight (1f1b)   ok   interleaved v %d   zb-h1"
                "     zb-v  dualpipev\n", v);
    for (int s = 0; s < p; ++s) {
      double ratio = ofob_mb[size_t(s)] / afab_mb[size_t(s)];
      std::printf("  %5d  [%d, %d)  %8.1f %8.1f   %9.3f  %d of %d            %s   %8.1f        %8.1f %8.1f %8.1f\n",
                  s, int(first[size_t(s)]), int(last[size_t(s)]), afab_mb[size_t(s)], ofob_mb[size_t(s)], ratio,
                  std::min(p - s, m), m, ratio <= target * 1.1 ? "yes" : "NO", inter_mb[size_t(s)], zb_mb[size_t(s)],
                  zbv_mb[size_t(s)], dpv_mb[size_t(s)]);
    }
    const double theory = theoretical_bubble_fraction(p, m);
    std::printf("\nbubble fraction (the fastest of %d steps; theory (p - 1)/(m + p - 1) = %.3f, target within 0.05)\n",
                steps, theory);
    std::printf("  afab  %.3f  (%+.3f)  %s\n", afab.bubble, afab.bubble - theory,
                std::abs(afab.bubble - theory) <= 0.05 ? "ok" : "OUT");
    std::printf("  1f1b  %.3f  (%+.3f)  %s   busiest stage %.3f (%+.3f)\n", ofob.bubble, ofob.bubble - theory,
                std::abs(ofob.bubble - theory) <= 0.05 ? "ok" : "OUT", ofob.busiest, ofob.busiest - theory);
    // ZB-H1's formula assumes F = B = W, which --simulate-ms makes true (simulated_stage.h).
    const double zt = zb_h1_bubble_fraction(p, m);
    std::printf("  zb-h1 %.3f  (theory with F = B = W (p - 1)/(3 m + p - 1) = %.3f: %+.3f)  %s   busiest stage %.3f "
                "(%+.3f)\n", zb.bubble, zt, zb.bubble - zt, std::abs(zb.bubble - zt) <= 0.05 ? "ok" : "OUT", zb.busiest,
                zb.busiest - zt);
    if (v > 1) {
      const double vt = theoretical_bubble_fraction(p, m, v);
      std::printf("  interleaved v %d  %.3f  (theory (p - 1)/(v m + p - 1) = %.3f: %+.3f)  %s\n", v, inter.bubble, vt,
                  inter.bubble - vt, std::abs(inter.bubble - vt) <= 0.05 ? "ok" : "OUT");
    }
    // ZB-V's and DualPipeV's with F = B = W on a chunk (a chunk sleeps its share of F).
    const double vt = zb_v_bubble_fraction(p, m);
    std::printf("  zb-v  %.3f  (theory with F = B = W on a chunk (p - 1)/(6 m + p - 1) = %.3f: %+.3f)  %s   busiest "
                "stage %.3f (%+.3f)\n", zbv.bubble, vt, zbv.bubble - vt, std::abs(zbv.bubble - vt) <= 0.05 ? "ok" : "OUT",
                zbv.busiest, zbv.busiest - vt);
    if (m >= 2 * p)
      std::printf("  dualpipev %.3f  (the same theory: %+.3f)  %s   busiest stage %.3f (%+.3f)\n", dpv.bubble,
                  dpv.bubble - vt, std::abs(dpv.bubble - vt) <= 0.05 ? "ok" : "OUT", dpv.busiest, dpv.busiest - vt);
    std::printf("\nstep time (rank 0, the fastest step): afab %.3f ms, 1f1b %.3f ms, zb-h1 %.3f ms, zb-v %.3f ms, dualpipev %.3f ms",
                afab.step_ms, ofob.step_ms, zb.step_ms, zbv.step_ms, dpv.step_ms);
    if (v > 1) std::printf(", interleaved v %d %.3f ms", v, inter.step_ms);
    std::printf("\n");
    if (m >= 2 * p) {  // overlapped_pairs.h: a pair takes max(F, B + W) = 2 chunk slots instead of 3
      std::vector<std::vector<ScheduledOp>> orders;
      for (int r = 0; r < p; ++r) orders.push_back(dualpipev_order(p, r, m));
      const double serial = step_slots(orders, ChunkLayout::V, false), overlapped = step_slots(orders, ChunkLayout::V, true);
      std::printf("dualpipev --overlap-pairs %.3f ms: %.3f of one half after the other (slots with F = B = W on a "
                  "chunk: %.0f of %.0f = %.3f)\n", dpv_overlap.step_ms, dpv_overlap.step_ms / dpv.step_ms, overlapped,
                  serial, overlapped / serial);
    }
    // What DualPipeV's pairs change (dualpipev_schedule.h): how much of a slow
    // link each order exposes. The same spans, replayed (schedule_diagram.h).
    std::printf("replayed with every transfer taking %.2f ms (the same spans): 1f1b %.3f ms, zb-h1 %.3f ms, zb-v "
                "%.3f ms, dualpipev %.3f ms\n", latency_ms, ofob.slow_links_ms, zb.slow_links_ms, zbv.slow_links_ms,
                dpv.slow_links_ms);
    return 0;
  });
}
