// The fast row kernels (tensor/cuda/fast/, LOOM_CUDA_KERNELS=fast) against
// the CPU and against the reference GPU kernels on the same inputs, at the
// shapes that choose each variant: a row not a multiple of 4 or 32 (scalar
// loads), 768 (a warp, 16-byte loads), 1500 and V = 50257 (a block per row),
// causal T = 1024; and bit-identical across two runs of the same input.
// Tolerances: those of test_cuda_nn.cpp (the sums run in another order, and
// nvcc contracts to FMAs), until a GPU run has measured them.
#include <functional>

#include "cuda_test.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::fast;
using cuda_test::random;
using cuda_test::reference;
using cuda_test::rtol_for;

namespace {

void expect_same_bits(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>()) << "two runs of the same input differ";
}

// fast on the GPU vs the CPU, vs the reference kernels, and vs itself run again.
void expect_fast_right(const std::function<Tensor()>& on_gpu, const Tensor& on_cpu, double rtol, double atol) {
  Tensor f = fast(on_gpu), again = fast(on_gpu), ref = reference(on_gpu);
  expect_close(f, on_cpu, rtol, atol);
  expect_close(f, ops::to(ref, kCPU), rtol, atol);  // (expect_close wants the GPU one first)
  expect_same_bits(f, again);
}

}  // namespace

using CudaRowsFast = cuda_test::CudaTest;

TEST_F(CudaRowsFast, SoftmaxLogSoftmaxAndTheirBackwards) {
  for (DType dt : {kFloat32, kBFloat16}) {
    for (Shape shape : {Shape{3, 4, 37}, Shape{64, 768}, Shape{5, 1500}, Shape{4, 50257}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << shape_str(shape));
      const double rtol = rtol_for(dt);
      Tensor x = ops::mul(random(shape, 1, dt), 3.0), dy = random(shape, 2, dt);
      Tensor gx = ops::to(x, gpu), gdy = ops::to(dy, gpu);
      Tensor y = ops::softmax(x), ly = ops::log_softmax(x);
      Tensor gy = ops::to(y, gpu), gly = ops::to(ly, gpu);
      expect_fast_right([&] { return ops::softmax(gx); }, y, rtol, 1e-6);
      expect_fast_right([&] { return ops::log_softmax(gx); }, ly, rtol, 1e-5);
      expect_fast_right([&] { return ops::softmax_backward(gdy, gy); }, ops::softmax_backward(dy, y), rtol, 1e-6);
      expect_fast_right([&] { return ops::log_softmax_backward(gdy, gly); }, ops::log_softmax_backward(dy, ly), rtol,
                        1e-5);
    }
  }
}

TEST_F(CudaRowsFast, CausalSoftmaxAndItsBackwardAtT1024) {
  for (Shape shape : {Shape{2, 3, 21, 21}, Shape{1, 2, 1024, 1024}}) {
    SCOPED_TRACE(shape_str(shape));
    Tensor s = random(shape, 3), ds = random(shape, 4);
    Tensor cy = ops::causal_softmax(s, 0.125);
    Tensor gs = ops::to(s, gpu), gds = ops::to(ds, gpu), gcy = ops::to(cy, gpu);
    expect_fast_right([&] { return ops::causal_softmax(gs, 0.125); }, cy, 1e-5, 1e-6);
    expect_fast_right([&] { return ops::causal_softmax_backward(gds, gcy, 0.125); },
                      ops::causal_softmax_backward(ds, cy, 0.125), 1e-5, 1e-6);
  }
}

TEST_F(CudaRowsFast, LayerNormForwardBackwardAndTwoPassWeightGrads) {
  for (DType dt : {kFloat32, kBFloat16}) {
    for (Shape shape : {Shape{4, 6, 37}, Shape{8, 64, 768}, Shape{3, 1500}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << shape_str(shape));
      const int64_t C = shape.back();
      const double rtol = rtol_for(dt);
      Tensor x = random(shape, 1, dt), w = random({C}, 2, dt), b = random({C}, 3, dt), dy = random(shape, 4, dt);
      Tensor gx = ops::to(x, gpu), gw = ops::to(w, gpu), gb = ops::to(b, gpu), gdy = ops::to(dy, gpu);
      ops::LayerNormResult c = ops::layer_norm(x, w, b, 1e-5);
      expect_fast_right([&] { return ops::layer_norm(gx, gw, gb, 1e-5).y; }, c.y, rtol, 1e-5);
      expect_fast_right([&] { return ops::layer_norm(gx, gw, gb, 1e-5).mean; }, c.mean, rtol, 1e-6);
      expect_fast_right([&] { return ops::layer_norm(gx, gw, gb, 1e-5).rstd; }, c.rstd, rtol, 1e-6);
      expect_fast_right([&] { return ops::layer_norm(gx, Tensor(), Tensor(), 1e-5).y; },
                        ops::layer_norm(x, Tensor(), Tensor(), 1e-5).y, rtol, 1e-5);
      ops::LayerNormGrads cg = ops::layer_norm_backward(dy, x, w, c.mean, c.rstd);
      Tensor gmean = ops::to(c.mean, gpu), grstd = ops::to(c.rstd, gpu);
      auto grads = [&] { return ops::layer_norm_backward(gdy, gx, gw, gmean, grstd); };
      // dw, db: 512 rows summed in 8 blocks of 64, then the 8 partials.
      const double sum_atol = 1e-4;
      expect_fast_right([&] { return grads().dx; }, cg.dx, rtol, 1e-5);
      expect_fast_right([&] { return grads().dweight; }, cg.dweight, std::max(rtol, 1e-4), sum_atol);
      expect_fast_right([&] { return grads().dbias; }, cg.dbias, std::max(rtol, 1e-4), sum_atol);
    }
  }
}

TEST_F(CudaRowsFast, CrossEntropyOverTheGpt2VocabularyWithIgnoredRows) {
  for (DType dt : {kFloat32, kBFloat16}) {
    for (int64_t V : {37, 1024, 50257}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " V " << V);
      Tensor logits = ops::mul(random({6, V}, 1, dt), 2.0);
      Tensor targets = from_vector(std::vector<int64_t>{5, -100, V - 1, 0, V / 2, -100});
      Tensor gl = ops::to(logits, gpu), gt = ops::to(targets, gpu);
      ops::CrossEntropyResult c = ops::cross_entropy(logits, targets, -100);
      ops::CrossEntropyResult g = fast([&] { return ops::cross_entropy(gl, gt, -100); });
      EXPECT_EQ(g.count, 4);
      expect_fast_right([&] { return ops::cross_entropy(gl, gt, -100).loss; }, c.loss, rtol_for(dt), 1e-6);
      expect_fast_right([&] { return ops::cross_entropy(gl, gt, -100).lse; }, c.lse, rtol_for(dt), 1e-5);
      Tensor grad = full({}, 0.5, dt), ggrad = ops::to(grad, gpu);
      expect_fast_right([&] { return ops::cross_entropy_backward(ggrad, gl, gt, g.lse, g.count, -100); },
                        ops::cross_entropy_backward(grad, logits, targets, c.lse, c.count, -100), rtol_for(dt), 1e-7);
    }
  }
  // A target past the vocabulary is the reference's error, at the loss.
  Tensor bad = ops::to(from_vector(std::vector<int64_t>{3, 50257}), gpu);
  try {
    fast([&] { return ops::cross_entropy(ops::to(random({2, 50257}, 5), gpu), bad, -100).count; });
    ADD_FAILURE() << "a target of 50257 in a vocabulary of 50257 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("50257 out of range for"), std::string::npos) << e.what();
  }
}

TEST_F(CudaRowsFast, EmbeddingBackwardIsTheCpusBitsForBit) {
  for (int64_t V : {11, 50257}) {
    SCOPED_TRACE(::testing::Message() << "V " << V);
    const int64_t N = 2048, C = 64;
    std::vector<int64_t> ids(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) ids[size_t(i)] = (i * 7919 + i / 5) % 97 * 517 % V;  // repeats, spread over V
    Tensor idx = from_vector(ids, {2, N / 2}), g = random({2, N / 2, C}, 6);
    Tensor gidx = ops::to(idx, gpu), gg = ops::to(g, gpu);
    expect_fast_right([&] { return ops::embedding_backward(gg, gidx, V); }, ops::embedding_backward(g, idx, V), 0, 0);
  }
}
