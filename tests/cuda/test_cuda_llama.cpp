// The ops Llama adds (tests/test_llama_ops.cpp checks them on the CPU) on the
// GPU against the CPU on the same inputs: rms_norm and its backward, rope
// (forward and inverse, a position offset, a transposed input) and silu with
// its backward, each through the LOOM_HOST_DEVICE functions of tensor/kernels/
// both devices call. Then a few steps of train_gpt --arch llama on the GPU
// against the CPU run.
#include "cuda_test.h"
#include "../run_command.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::random;
using cuda_test::rtol_for;

using CudaLlama = cuda_test::CudaTest;

TEST_F(CudaLlama, RMSNormAndItsBackward) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double rtol = rtol_for(dt);
    Tensor x = random({4, 6, 40}, 1, dt), w = random({40}, 2, dt), dy = random({4, 6, 40}, 3, dt);
    ops::RMSNormResult c = ops::rms_norm(x, w, 1e-5);
    ops::RMSNormResult g = ops::rms_norm(ops::to(x, gpu), ops::to(w, gpu), 1e-5);
    expect_close(g.y, c.y, rtol, 1e-5);
    expect_close(g.rstd, c.rstd, rtol, 1e-6);
    ops::RMSNormGrads cg = ops::rms_norm_backward(dy, x, w, c.rstd);
    ops::RMSNormGrads gg = ops::rms_norm_backward(ops::to(dy, gpu), ops::to(x, gpu), ops::to(w, gpu), g.rstd);
    expect_close(gg.dx, cg.dx, rtol, 1e-5);
    expect_close(gg.dweight, cg.dweight, rtol, 1e-5);
  }
}

TEST_F(CudaLlama, RoPEForwardInverseAndOffset) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double rtol = rtol_for(dt);
    Tensor x = random({2, 3, 9, 16}, 4, dt);  // [B, H, T, hd]
    for (double base : {10000.0, 500000.0})
      for (int64_t pos0 : {0, 7})
        for (bool inverse : {false, true})
          expect_close(ops::rope(ops::to(x, gpu), base, pos0, inverse), ops::rope(x, base, pos0, inverse), rtol, 1e-6);
    Tensor heads = ops::transpose(random({2, 9, 3, 16}, 5, dt), 1, 2);  // not contiguous, as attention passes q
    expect_close(ops::rope(ops::to(heads, gpu), 10000.0), ops::rope(heads, 10000.0), rtol, 1e-6);
  }
}

TEST_F(CudaLlama, SiLUAndItsBackward) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double rtol = rtol_for(dt);
    Tensor x = ops::mul(random({5, 33}, 6, dt), 4.0), g = random({5, 33}, 7, dt);
    expect_close(ops::silu(ops::to(x, gpu)), ops::silu(x), rtol, 1e-6);
    expect_close(ops::silu_backward(ops::to(g, gpu), ops::to(x, gpu)), ops::silu_backward(g, x), rtol, 1e-6);
  }
}

// A few steps of the Llama blocks on the GPU track the CPU's losses.
TEST_F(CudaLlama, TrainGptArchLlamaOnTheGpuTracksTheCpu) {
  const std::string common = " --arch llama --kv-heads 2 --steps 5 --layers 2 --heads 4 --embd 32 --block 16 --batch 8"
                             " --eval-every 0 --sample 0 --log-every 1 2>&1";
  const test::Exec cpu = test::run_command(std::string(LOOM_TRAIN_GPT) + common);
  const test::Exec gpu = test::run_command(std::string(LOOM_TRAIN_GPT) + " --device cuda" + common);
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  ASSERT_EQ(gpu.status, 0) << gpu.output;
  auto losses = [](const std::string& out) {
    std::vector<double> v;
    for (size_t at = out.find("| loss "); at != std::string::npos; at = out.find("| loss ", at + 1))
      v.push_back(std::stod(out.substr(at + 7)));
    return v;
  };
  const std::vector<double> a = losses(cpu.output), b = losses(gpu.output);
  ASSERT_EQ(a.size(), 5u) << cpu.output;
  ASSERT_EQ(b.size(), 5u) << gpu.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 2e-4 * a[i]) << "step " << i + 1;  // 4 printed decimals
}
