// What the mixture-of-experts train_gpt tests share (test_train_gpt_expert_parallel.cpp,
// test_train_gpt_moe_pipeline.cpp, test_train_gpt_moe_tensor_parallel.cpp,
// test_train_gpt_moe_combined.cpp): the tiny model's flags,
// the routing log compared with one process's, and save at step 5 -> resume in two places.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "train_gpt_run.h"

namespace loom::test::moe {

inline const std::string kMoE = " --arch llama --experts 4 --experts-per-token 2 --batch 4 ";
// Every routing option: shared experts, a capacity that drops, the aux and z losses, DeepSeek-V3's bias.
inline const std::string kRouting = "--shared-experts 1 --capacity-factor 1.0 --router-aux-loss-coef 0.05 "
                                    "--router-z-loss-coef 0.001 --router-bias-update-rate 0.01 ";
// The same, dropless: what a micro-batch split over ranks (sequence parallel, cp) can equal.
inline const std::string kDropless = "--shared-experts 1 --router-aux-loss-coef 0.05 --router-z-loss-coef 0.001 "
                                     "--router-bias-update-rate 0.01 ";

// The log's routing numbers (balance, dropped fraction, busiest expert) are the whole step's over every
// rank that holds a part of it: one process's, every step.
inline void expect_same_routing_log(const Result& got, const Result& ref, const std::string& what) {
  ASSERT_EQ(got.log.size(), ref.log.size()) << what;
  for (size_t i = 0; i < ref.log.size(); ++i) {
    EXPECT_NEAR(field(got.log[i], "moe_balance"), field(ref.log[i], "moe_balance"), 1e-5) << what << " step " << i;
    EXPECT_EQ(field(got.log[i], "moe_dropped"), field(ref.log[i], "moe_dropped")) << what << " step " << i;
    EXPECT_EQ(field(got.log[i], "moe_max_load"), field(ref.log[i], "moe_max_load")) << what << " step " << i;
  }
}

// Save at `parallel` (`ranks` ranks) at step 5; resume there (the same bits as straight through) and in one
// process run with `one_process` added (within 1e-5): the checkpoint holds one process's names, every
// expert whole, so it reshards (under --ep each rank's experts' optimizer state is found by name).
// `saved`, if given, gets the run that saved (its weights are the checkpoint's model file); `straight_run`,
// if given, is the run of flags + parallel straight through, already made (one run fewer).
inline void expect_save_resumes(const std::string& name, const std::string& flags, const std::string& parallel,
                                const std::string& one_process, Result* saved = nullptr, int ranks = 2,
                                const Result* straight_run = nullptr) {
  const Result straight = straight_run ? *straight_run : train(name + "_straight", ranks, flags + parallel);
  const Result first = train(name + "_first", ranks, flags + parallel + " --stop-at 5");
  ASSERT_EQ(first.status, 0) << first.output;
  if (saved) *saved = first;
  const Result resumed = train(name + "_resumed", ranks, flags + parallel + " --resume " + checkpoint(name + "_first"));
  const Result one = train(name + "_resumed_1", 1, flags + one_process + " --resume " + checkpoint(name + "_first"));
  ASSERT_EQ(straight.status, 0) << straight.output;
  for (const Result* r : {&resumed, &one}) {
    ASSERT_EQ(r->status, 0) << r->output;
    ASSERT_EQ(r->losses.size(), 5u);
  }
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(resumed.losses[i], straight.losses[5 + i]) << "step " << 5 + i;
    EXPECT_EQ(resumed.grad_norms[i], straight.grad_norms[5 + i]) << "step " << 5 + i;
    EXPECT_NEAR(one.losses[i], straight.losses[5 + i], 1e-5 * straight.losses[5 + i]) << "step " << 5 + i;
  }
  ASSERT_EQ(one.weights.tensors.size(), straight.weights.tensors.size());
  for (const auto& [tensor, t] : straight.weights.tensors) {
    EXPECT_EQ(resumed.weights.at(tensor).to_vector<float>(), t.to_vector<float>()) << tensor;
    const Diff d = diff_of(one.weights.at(tensor), t);
    EXPECT_LE(d.l2_diff, 1e-5 * d.l2_ref) << tensor;
  }
}

// A model that Hugging Face's Mixtral reads (capacity and aux loss, no routing bias), exported from `ranks`
// ranks under `parallel` and from one process under `one_process`: the same tensors, each within 1e-5 (l2).
inline const std::string kExportable = kMoE + "--capacity-factor 1.0 --router-aux-loss-coef 0.05 ";
inline void expect_export_equals_one_process(const std::string& name, int ranks, const std::string& parallel,
                                             const std::string& one_process) {
  const Result got = train_and_export(name, ranks, kExportable + parallel);
  const Result one = train_and_export(name + "_1", 1, kExportable + one_process);
  ASSERT_EQ(got.status, 0) << got.output;
  ASSERT_EQ(one.status, 0) << one.output;
  ASSERT_EQ(got.weights.tensors.size(), one.weights.tensors.size());
  EXPECT_TRUE(got.weights.contains("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  for (const auto& [tensor, t] : one.weights.tensors) {
    const Diff d = diff_of(got.weights.at(tensor), t);
    EXPECT_LE(d.l2_diff, 1e-5 * d.l2_ref) << tensor;
  }
}

}  // namespace loom::test::moe
