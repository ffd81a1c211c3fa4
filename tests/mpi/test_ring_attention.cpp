// Ring attention (parallel/context_parallel/ring_attention.h) against one
// process's attention (nn::attend) on the whole sequence. CTest runs it on 1, 2
// and 4 ranks, cp = world: every rank draws the same full q, k, v [B, H, T, hd]
// and upstream gradient, takes its zig-zag chunks (zigzag.h), runs the ring
// forward and backward, and compares its output and its q, k, v gradients with
// the same chunks of the reference: fp32 within 1e-5 of the reference's
// scale, fp64 within 1e-12.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "nn/attention.h"
#include "parallel/comm/distributed.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/zigzag.h"
#include "parallel/model.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;
namespace ag = loom::autograd;

namespace {

ProcessGroup& cp() { return parallel::world(); }

// max |a - b| <= tol * max |b| (and equal shapes).
void expect_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) diff = std::max(diff, std::abs(x[i] - y[i])), scale = std::max(scale, std::abs(y[i]));
  EXPECT_LE(diff, tol * std::max(scale, 1e-6)) << what << ": max |diff| " << diff << " of scale " << scale << " on cp rank "
                                               << cp().rank() << " of " << cp().size();
}

Tensor leaf(const Tensor& t) {
  Tensor c = ops::clone(t);
  ag::set_requires_grad(c, true);
  return c;
}

// This rank's zig-zag chunks of a [B, H, T, hd] tensor.
Tensor mine(const Tensor& x) { return zigzag_take(x, 2, cp().size(), cp().rank()); }

void ring_equals_one_process(DType dtype, double tol) {
  Generator gen(21);
  const int64_t B = 2, H = 3, T = 16, hd = 4;  // T = 16: 2 x cp chunks for cp = 1, 2, 4
  // Scores of a few units, so the rows' maxima differ from block to block.
  Tensor q = randn({B, H, T, hd}, gen, dtype, 0.0, 2.0), k = randn({B, H, T, hd}, gen, dtype, 0.0, 2.0);
  Tensor v = randn({B, H, T, hd}, gen, dtype), r = randn({B, H, T, hd}, gen, dtype);
  Tensor qf = leaf(q), kf = leaf(k), vf = leaf(v);
  Tensor yf = nn::attend(qf, kf, vf, nullptr);
  ag::backward(ag::sum(ag::mul(yf, r)));

  Tensor ql = leaf(mine(q)), kl = leaf(mine(k)), vl = leaf(mine(v));
  Tensor y = ring_attention(ql, kl, vl, cp());
  ag::backward(ag::sum(ag::mul(y, mine(r))));
  expect_close(y, mine(yf), tol, "output");
  expect_close(ag::grad(ql), mine(ag::grad(qf)), tol, "dq");
  expect_close(ag::grad(kl), mine(ag::grad(kf)), tol, "dk (home after the backward ring)");
  expect_close(ag::grad(vl), mine(ag::grad(vf)), tol, "dv (home after the backward ring)");
}

}  // namespace

TEST(RingAttention, EqualsOneProcessFp32) { ring_equals_one_process(kFloat32, 1e-5); }
TEST(RingAttention, EqualsOneProcessFp64) { ring_equals_one_process(kFloat64, 1e-12); }

// The seam: a CausalSelfAttention whose core is the ring, on this rank's
// tokens, equals the layer with attend() on the whole sequence (q, k, v are
// views there: heads split by a transpose).
TEST(RingAttention, AsTheCoreOfCausalSelfAttention) {
  const int64_t B = 2, T = 8 * 2, C = 12;
  Generator g1(5), g2(5), gx(6);
  nn::CausalSelfAttention full(C, 3, g1, 0.02), ring(C, 3, g2, 0.02);
  ring.core = ring_attention_core(cp());
  Tensor x = randn({B, T, C}, gx), r = randn({B, T, C}, gx);
  Tensor xf = leaf(x), xl = leaf(zigzag_take(x, 1, cp().size(), cp().rank()));
  Tensor yf = full.forward(xf), yl = ring.forward(xl);
  ag::backward(ag::sum(ag::mul(yf, r)));
  ag::backward(ag::sum(ag::mul(yl, zigzag_take(r, 1, cp().size(), cp().rank()))));
  const auto take = [](const Tensor& t) { return zigzag_take(t, 1, cp().size(), cp().rank()); };
  expect_close(yl, take(yf), 1e-5, "output");
  expect_close(ag::grad(xl), take(ag::grad(xf)), 1e-5, "input grad");
  // A weight's gradient is the sum over the cp ranks' tokens (why dp x cp averages them).
  Tensor gw = ops::clone(ag::grad(ring.c_attn->weight));
  cp().all_reduce(gw);
  expect_close(gw, ag::grad(full.c_attn->weight), 1e-5, "c_attn weight grad summed over cp");
}

// RoPE under cp turns each of the rank's zig-zag chunks from its first true
// position, so a block must see exactly the rank's T / cp tokens of each
// sequence, as the learned positions' embedding checks (nn::EmbeddingLayer::
// positions). Given a whole sequence instead, a Llama block stops before any
// collective, naming both counts (it used to rotate 2 chunks of 8 from
// positions 0 and 12 and run the ring on them).
TEST(RingAttention, LlamaBlockRefusesTokensThatAreNotItsChunks) {
  if (cp().size() == 1) GTEST_SKIP() << "cp = 1: the positions are 0..T-1, any T";
  nn::GPTConfig cfg;
  cfg.set_arch("llama");
  cfg.vocab_size = 10, cfg.block_size = 16, cfg.n_layer = 1, cfg.n_head = 2, cfg.n_embd = 8;
  ProcessGroupManager pgm(/*dp=*/1, /*pp=*/1, /*tp=*/1, /*cp=*/cp().size(), world());
  Model m = build_model(cfg, pgm);
  nn::Layer& block = *m.chunks->layers().at(1);
  const int64_t mine = 16 / cp().size();
  try {
    block.forward(zeros({1, 16, 8}));  // the whole sequence, not this rank's chunks
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(str("16 tokens of each sequence, but its RoPE positions are this cp rank's "
                                             "2 chunks of ", mine / 2, " (", mine, " tokens)")),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(block.forward(zeros({1, mine, 8})).shape(), (Shape{1, mine, 8}));  // its own chunks
}

TEST(RingAttention, RefusesAnOddNumberOfTokensPerRank) {
  Tensor q = zeros({1, 1, 3, 2});
  try {
    ring_attention(q, q, q, cp());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two equal chunks of the sequence (zig-zag), but it has 3 tokens"),
              std::string::npos)
        << e.what();
  }
}

TEST(ZigZag, PositionsOfEachRank) {
  EXPECT_EQ(zigzag_positions(8, 2, 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(zigzag_positions(8, 2, 1).to_vector<int64_t>(), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(zigzag_positions(8, 4, 3).to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
  try {
    zigzag_positions(12, 4, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--block 12 is not divisible by 8"), std::string::npos) << e.what();
  }
}
