// One-launch AdamW (adamw_multi_tensor.h): a block per chunk of the chunk
// table, the per-tensor pointers and scalars beside it in one device buffer
// (fast/chunk_table.cuh).
#include "tensor/cuda/fast/adamw_multi_tensor.h"

#include "tensor/cuda/fast/chunk_table.cuh"

namespace loom::cuda {
namespace {

// Elements a block: 16 a thread of a 256-thread block, apex's order of size.
constexpr int64_t kChunk = 16 * kThreads;

// One tensor's row of the table.
template <class P>
struct TensorSlot {
  P* p;
  float* m;
  float* v;
  const float* g;
  kernels::AdamWScalars<float> s;
};

template <class P>
__global__ void adamw_multi_tensor_kernel(const kernels::TensorChunk* chunks, const TensorSlot<P>* slots) {
  const kernels::TensorChunk c = chunks[blockIdx.x];
  const TensorSlot<P> t = slots[c.tensor];
  const int64_t end = c.begin + c.size;
  for (int64_t i = c.begin + threadIdx.x; i < end; i += blockDim.x) {  // coalesced: neighbours read neighbours
    float x = to_compute(t.p[i]);
    kernels::adamw_update(x, t.m[i], t.v[i], t.g[i], t.s);  // adamw_kernel's math and conversions
    t.p[i] = from_compute<P>(x);
  }
}

template <class P>
void launch(const std::vector<Tensor>& p, const std::vector<Tensor>& m, const std::vector<Tensor>& v,
            const std::vector<Tensor>& g, const std::vector<kernels::AdamWScalars<float>>& s) {
  std::vector<int64_t> numels;
  std::vector<TensorSlot<P>> slots;
  for (size_t i = 0; i < p.size(); ++i) {
    numels.push_back(p[i].numel());
    slots.push_back({ptr<P>(p[i]), ptr<float>(m[i]), ptr<float>(v[i]), ptr<float>(g[i]), s[i]});
  }
  const std::vector<kernels::TensorChunk> chunks = kernels::tensor_chunks(numels, kChunk);
  if (chunks.empty()) return;
  // One upload of [chunks | slots] (chunk_table.cuh); the device copy lives in
  // the caching allocator until after the kernel (stream-ordered frees).
  const Device d = p.front().device();
  const ChunkTable t = upload_chunk_table(chunks, slots, 0, d);
  adamw_multi_tensor_kernel<P><<<unsigned(chunks.size()), kThreads, 0, stream(d)>>>(
      t.chunks, static_cast<const TensorSlot<P>*>(t.slots));
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_multi_tensor(const std::vector<Tensor>& p, const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                        const std::vector<Tensor>& g, const std::vector<kernels::AdamWScalars<float>>& s) {
  LOOM_CHECK(m.size() == p.size() && v.size() == p.size() && g.size() == p.size() && s.size() == p.size(),
             "adamw_multi_tensor: ", p.size(), " params, ", m.size(), " exp_avg, ", v.size(), " exp_avg_sq, ",
             g.size(), " grads, ", s.size(), " scalars");
  if (p.empty()) return;
  const Device d = p.front().device();
  const DType dt = p.front().dtype();
  for (size_t i = 0; i < p.size(); ++i) {
    LOOM_CHECK(p[i].device() == d && p[i].dtype() == dt && p[i].is_contiguous(), "adamw_multi_tensor: param ", i,
               " ", p[i].describe(), " on ", p[i].device().str(), ": the params must be contiguous, of one dtype (",
               dtype_name(dt), "), on one device (", d.str(), ")");
    for (const Tensor* t : {&m[i], &v[i], &g[i]})
      LOOM_CHECK(t->device() == d && t->dtype() == kFloat32 && t->is_contiguous() && t->numel() == p[i].numel(),
                 "adamw_multi_tensor: param ", i, " ", p[i].describe(), ": state/gradient ", t->describe(), " on ",
                 t->device().str(), " must be contiguous fp32 of its size on ", d.str());
  }
  LOOM_CHECK(d.is_cuda(), "adamw_multi_tensor: params on ", d.str(), ", a GPU expected");
  DeviceGuard guard(d);
  switch (dt) {
    case DType::Float32: return launch<float>(p, m, v, g, s);
    case DType::BFloat16: return launch<bfloat16>(p, m, v, g, s);
    case DType::Float16: return launch<float16>(p, m, v, g, s);
    default: throw Error(str("adamw_multi_tensor: params of ", dtype_name(dt), ": fp32, bf16 or fp16 expected"));
  }
}

}  // namespace loom::cuda
