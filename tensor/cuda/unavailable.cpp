// tensor/cuda/cuda.h and cuda_ops.h in a build without CUDA (LOOM_CUDA=OFF):
// no devices, and everything that needs one says how to get it. The op entry
// points are unreachable (no CUDA tensor can be made), but must exist for the
// ops' `if (x.device().is_cuda())` branches to link.
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/fast/adamw_multi_tensor.h"
#include "tensor/cuda/fast/grad_norm_multi_tensor.h"
#include "tensor/cuda/fast/unscale_multi_tensor.h"
#include "tensor/error.h"

namespace loom::cuda {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(str(what, ": loom was built without CUDA (configure with -DLOOM_CUDA=ON)"));
}
}  // namespace

int device_count() { return 0; }
bool is_available() { return false; }
std::string unavailable_reason() { return "loom was built without CUDA (configure with -DLOOM_CUDA=ON)"; }
void synchronize(const Device& d) {
  if (d.is_cuda()) no_cuda("synchronize");
}
DeferIndexErrors::DeferIndexErrors() : saved_(false) {}
DeferIndexErrors::~DeferIndexErrors() = default;
bool DeferIndexErrors::active() { return false; }
TimingEvent record_timing_event(const Device&, void*) { no_cuda("record_timing_event"); }
double elapsed_ms(const TimingEvent&, const TimingEvent&) { no_cuda("elapsed_ms"); }
void destroy_timing_event(TimingEvent& e) { e = TimingEvent{}; }
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }
AllocatorStats allocator_stats(const Device&) { no_cuda("allocator_stats"); }
void empty_cache(const Device&) { no_cuda("empty_cache"); }

void copy_(const Tensor&, const Tensor&) { no_cuda("copy_"); }
void copy_on_device(const Tensor&, const Tensor&) { no_cuda("copy_"); }
void fill_(const Tensor&, double) { no_cuda("fill_"); }
void zero_(const Tensor&) { no_cuda("zero_"); }
Tensor where(const Tensor&, const Tensor&, const Tensor&, const Shape&) { no_cuda("where"); }
Tensor unary(Unary, const Tensor&, double) { no_cuda("unary op"); }
Tensor binary(Binary, const Tensor&, const Tensor&) { no_cuda("binary op"); }
void mul_(const Tensor&, double) { no_cuda("mul_"); }
void add_(const Tensor&, const Tensor&, double) { no_cuda("add_"); }
Tensor sum_in_double(const Tensor&, const std::vector<bool>&) { no_cuda("sum"); }
void max_rows(const Tensor&, const Tensor&, const Tensor&) { no_cuda("max"); }
Tensor matmul(const Tensor&, const Tensor&) { no_cuda("matmul"); }
Tensor linear(const Tensor&, const Tensor&, const Tensor&) { no_cuda("linear"); }
ops::LinearGeluResult linear_gelu(const Tensor&, const Tensor&, const Tensor&) { no_cuda("linear_gelu"); }
ops::LinearGrads linear_backward(const Tensor&, const Tensor&, const Tensor&, bool, bool, bool) {
  no_cuda("linear_backward");
}
Tensor softmax(const Tensor&) { no_cuda("softmax"); }
Tensor log_softmax(const Tensor&) { no_cuda("log_softmax"); }
Tensor softmax_backward(const Tensor&, const Tensor&) { no_cuda("softmax_backward"); }
Tensor log_softmax_backward(const Tensor&, const Tensor&) { no_cuda("log_softmax_backward"); }
Tensor causal_softmax(const Tensor&, double) { no_cuda("causal_softmax"); }
Tensor causal_softmax_backward(const Tensor&, const Tensor&, double) { no_cuda("causal_softmax_backward"); }
ops::LayerNormResult layer_norm(const Tensor&, const Tensor&, const Tensor&, double) { no_cuda("layer_norm"); }
ops::LayerNormGrads layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("layer_norm_backward");
}
ops::RMSNormResult rms_norm(const Tensor&, const Tensor&, double) { no_cuda("rms_norm"); }
ops::RMSNormGrads rms_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("rms_norm_backward");
}
Tensor rope(const Tensor&, const Tensor&, const Tensor&, bool) { no_cuda("rope"); }
Tensor embedding(const Tensor&, const Tensor&) { no_cuda("embedding"); }
Tensor embedding_backward(const Tensor&, const Tensor&, int64_t) { no_cuda("embedding_backward"); }
ops::CrossEntropyResult cross_entropy(const Tensor&, const Tensor&, int64_t) { no_cuda("cross_entropy"); }
Tensor cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t) {
  no_cuda("cross_entropy_backward");
}

void dropout_mask(const Tensor&, uint64_t, uint64_t, uint32_t, double) { no_cuda("dropout"); }

void adamw_update(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const kernels::AdamWScalars<float>&) {
  no_cuda("AdamW");
}
void adamw_update(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const kernels::AdamWScalars<double>&) {
  no_cuda("AdamW");
}
bool unscale_(const std::vector<Tensor>&, double) { no_cuda("unscale_"); }
void adamw_multi_tensor(const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                        const std::vector<Tensor>&, const std::vector<kernels::AdamWScalars<float>>&) {
  no_cuda("adamw_multi_tensor");
}
bool unscale_multi_tensor(const std::vector<Tensor>&, double) { no_cuda("unscale_multi_tensor"); }
void scale_multi_tensor(const std::vector<Tensor>&, double) { no_cuda("scale_multi_tensor"); }
double sum_of_squares_multi_tensor(const std::vector<Tensor>&) { no_cuda("sum_of_squares_multi_tensor"); }
Tensor index_select(const Tensor&, int64_t, const Tensor&) { no_cuda("index_select"); }
Tensor index_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { no_cuda("index_add"); }
Tensor gather(const Tensor&, int64_t, const Tensor&) { no_cuda("gather"); }
Tensor scatter_add(const Shape&, int64_t, const Tensor&, const Tensor&) { no_cuda("scatter_add"); }

}  // namespace loom::cuda
