// GEMMs through cuBLAS and the per-row kernels of tensor/kernels/ on the GPU,
// against the CPU on the same inputs: matmul (2-D, batched, broadcast batch,
// transposed operands), linear and its backward, softmax / log_softmax / the
// causal softmax and their backwards, layer_norm and its backward, embedding
// (+ deterministic backward) and cross-entropy with ignore_index.
#include "cuda_test.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::random;
using cuda_test::rtol_for;

using CudaNn = cuda_test::CudaTest;

// fp32 GEMMs sum in another order than oneDNN/OpenBLAS: agree to rounding.
constexpr double kGemmRtol = 1e-4, kGemmAtol = 1e-5;

TEST_F(CudaNn, MatmulTwoDBatchedBroadcastAndTransposed) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double rtol = dt == kFloat32 ? kGemmRtol : rtol_for(dt);
    auto check = [&](const Tensor& a, const Tensor& b) {
      expect_close(ops::matmul(ops::to(a, gpu), ops::to(b, gpu)), ops::matmul(a, b), rtol, kGemmAtol);
    };
    check(random({7, 5}, 1, dt), random({5, 3}, 2, dt));                 // 2-D
    check(random({4, 7, 5}, 3, dt), random({4, 5, 3}, 4, dt));           // batched
    check(random({2, 1, 7, 5}, 5, dt), random({3, 5, 3}, 6, dt));        // broadcast batch dims
    check(random({4, 7, 5}, 7, dt), random({5, 3}, 8, dt));              // [..., M, K] @ [K, N]: folded
    Tensor at = ops::transpose(random({4, 5, 7}, 9, dt), -1, -2);         // transposed operands, passed as such
    Tensor bt = ops::transpose(random({4, 3, 5}, 10, dt), -1, -2);
    check(at, bt);
    expect_close(ops::matmul(ops::transpose(ops::to(random({4, 5, 7}, 9, dt), gpu), -1, -2),
                             ops::transpose(ops::to(random({4, 3, 5}, 10, dt), gpu), -1, -2)),
                 ops::matmul(at, bt), rtol, kGemmAtol);
    check(ops::permute(random({7, 4, 5}, 11, dt), {1, 0, 2}), random({4, 5, 3}, 12, dt));  // batch stride != M*K
    check(random({0, 5}, 13, dt), random({5, 3}, 14, dt));               // empty
    check(random({3, 0}, 15, dt), random({0, 4}, 16, dt));               // K = 0: zeros
  }
}

TEST_F(CudaNn, LinearAndItsBackward) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double rtol = dt == kFloat32 ? kGemmRtol : rtol_for(dt);
    Tensor x = random({2, 5, 8}, 1, dt), w = random({6, 8}, 2, dt), b = random({6}, 3, dt), g = random({2, 5, 6}, 4, dt);
    Tensor gx = ops::to(x, gpu), gw = ops::to(w, gpu), gb = ops::to(b, gpu), gg = ops::to(g, gpu);
    expect_close(ops::linear(gx, gw, gb), ops::linear(x, w, b), rtol, kGemmAtol);
    expect_close(ops::linear(gx, gw, Tensor()), ops::linear(x, w, Tensor()), rtol, kGemmAtol);
    ops::LinearGrads on_gpu = ops::linear_backward(gg, gx, gw, true, true, true);
    ops::LinearGrads on_cpu = ops::linear_backward(g, x, w, true, true, true);
    expect_close(on_gpu.dx, on_cpu.dx, rtol, kGemmAtol);
    expect_close(on_gpu.dw, on_cpu.dw, rtol, kGemmAtol);
    expect_close(on_gpu.db, on_cpu.db, rtol_for(dt), 1e-6);
  }
}

TEST_F(CudaNn, SoftmaxFamilyAndTheirBackwards) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double rtol = rtol_for(dt);
    Tensor x = ops::mul(random({3, 4, 37}, 1, dt), 3.0), dy = random({3, 4, 37}, 2, dt);
    Tensor gx = ops::to(x, gpu), gdy = ops::to(dy, gpu);
    expect_close(ops::softmax(gx), ops::softmax(x), rtol, 1e-6);
    expect_close(ops::log_softmax(gx), ops::log_softmax(x), rtol, 1e-5);
    expect_close(ops::softmax(ops::transpose(gx, 0, 1)), ops::softmax(ops::transpose(x, 0, 1)), rtol, 1e-6);
    Tensor y = ops::softmax(x), ly = ops::log_softmax(x);
    expect_close(ops::softmax_backward(gdy, ops::to(y, gpu)), ops::softmax_backward(dy, y), rtol, 1e-6);
    expect_close(ops::log_softmax_backward(gdy, ops::to(ly, gpu)), ops::log_softmax_backward(dy, ly), rtol, 1e-5);
    // Causal attention scores [B, H, T, T]: T = 21 covers a partial vector of 16.
    Tensor s = random({2, 3, 21, 21}, 3, dt), ds = random({2, 3, 21, 21}, 4, dt);
    Tensor cy = ops::causal_softmax(s, 0.125);
    expect_close(ops::causal_softmax(ops::to(s, gpu), 0.125), cy, rtol, 1e-6);
    expect_close(ops::causal_softmax_backward(ops::to(ds, gpu), ops::to(cy, gpu), 0.125),
                 ops::causal_softmax_backward(ds, cy, 0.125), rtol, 1e-6);
  }
}

TEST_F(CudaNn, LayerNormAndItsBackward) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double rtol = rtol_for(dt);
    Tensor x = random({4, 6, 40}, 1, dt), w = random({40}, 2, dt), b = random({40}, 3, dt), dy = random({4, 6, 40}, 4, dt);
    ops::LayerNormResult c = ops::layer_norm(x, w, b, 1e-5);
    ops::LayerNormResult g = ops::layer_norm(ops::to(x, gpu), ops::to(w, gpu), ops::to(b, gpu), 1e-5);
    expect_close(g.y, c.y, rtol, 1e-5);
    expect_close(g.mean, c.mean, rtol, 1e-6);
    expect_close(g.rstd, c.rstd, rtol, 1e-6);
    ops::LayerNormGrads cg = ops::layer_norm_backward(dy, x, w, c.mean, c.rstd);
    ops::LayerNormGrads gg = ops::layer_norm_backward(ops::to(dy, gpu), ops::to(x, gpu), ops::to(w, gpu), g.mean, g.rstd);
    expect_close(gg.dx, cg.dx, rtol, 1e-5);
    expect_close(gg.dweight, cg.dweight, rtol, 1e-5);
    expect_close(gg.dbias, cg.dbias, rtol, 1e-5);
    ops::LayerNormResult plain = ops::layer_norm(ops::to(x, gpu), Tensor(), Tensor(), 1e-5);  // no affine
    expect_close(plain.y, ops::layer_norm(x, Tensor(), Tensor(), 1e-5).y, rtol, 1e-5);
  }
}

TEST_F(CudaNn, EmbeddingAndADeterministicBackward) {
  Tensor w = random({11, 16}, 1);
  Tensor idx = from_vector(std::vector<int64_t>{3, 0, 3, 10, 7, 3, 0, 2}, {2, 4});  // repeated rows
  Tensor gidx = ops::to(idx, gpu);
  expect_close(ops::embedding(ops::to(w, gpu), gidx), ops::embedding(w, idx), 0, 0);
  expect_close(ops::embedding(ops::to(w, gpu), ops::to(ops::to(idx, kInt32), gpu)), ops::embedding(w, idx), 0, 0);
  Tensor g = random({2, 4, 16}, 2);
  Tensor dw = ops::embedding_backward(ops::to(g, gpu), gidx, 11);
  expect_close(dw, ops::embedding_backward(g, idx, 11), 0, 0);  // the CPU's order per element: the same bits
  EXPECT_EQ(dw.to_vector<float>(), ops::embedding_backward(ops::to(g, gpu), gidx, 11).to_vector<float>());
}

TEST_F(CudaNn, CrossEntropyWithIgnoreIndexAndItsBackward) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor logits = ops::mul(random({9, 65}, 1, dt), 2.0);
    Tensor targets = from_vector(std::vector<int64_t>{5, -100, 64, 0, 12, -100, 33, 33, 1});
    ops::CrossEntropyResult c = ops::cross_entropy(logits, targets, -100);
    ops::CrossEntropyResult g = ops::cross_entropy(ops::to(logits, gpu), ops::to(targets, gpu), -100);
    EXPECT_EQ(g.count, 7);
    EXPECT_EQ(g.count, c.count);
    expect_close(g.loss, c.loss, rtol_for(dt), 1e-6);
    expect_close(g.lse, c.lse, rtol_for(dt), 1e-6);
    Tensor grad = full({}, 0.5, dt);
    expect_close(ops::cross_entropy_backward(ops::to(grad, gpu), ops::to(logits, gpu), ops::to(targets, gpu), g.lse,
                                             g.count, -100),
                 ops::cross_entropy_backward(grad, logits, targets, c.lse, c.count, -100), rtol_for(dt), 1e-7);
  }
  // Every row ignored: NaN, as on the CPU and in PyTorch.
  Tensor all_ignored = ops::to(full({2}, -100, kInt64), gpu);
  EXPECT_TRUE(std::isnan(ops::cross_entropy(ops::to(random({2, 5}, 3), gpu), all_ignored, -100).loss.item<double>()));
}
