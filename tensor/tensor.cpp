#include "tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "tensor/cpu/dispatch.h"
#include "tensor/ops.h"

namespace loom {

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

static int64_t wrap_dim(const char* op, int64_t d, int64_t ndim) {
  LOOM_CHECK(d >= -ndim && d < ndim, op, ": dim ", d, " out of range for a ", ndim, "-d tensor");
  return d < 0 ? d + ndim : d;
}

int64_t Tensor::size(int64_t d) const { return impl_->shape[wrap_dim("size", d, dim())]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim("stride", d, dim())]; }

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != acc) return false;
    acc *= impl_->shape[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  LOOM_CHECK(defined(), "data: tensor is undefined");
  LOOM_CHECK(impl_->storage->is_allocated(), "data: the storage of ", describe(),
             " was released (a ZeRO-3 param read outside its unit's all-gather)");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * int64_t(element_size(dtype()));
}

Tensor Tensor::alias() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = device().is_cuda() ? ops::to(*this, kCPU) : ops::contiguous(*this);  // waits for the GPU
  std::vector<T> out(size_t(c.numel()));
  LOOM_DISPATCH_ALL(c.dtype(), "to_vector", {
    const scalar_t* p = c.data<scalar_t>();
    for (size_t i = 0; i < out.size(); ++i) {
      // Integers convert directly: going through double would lose bits of large int64 values.
      if constexpr (std::is_integral_v<scalar_t>) out[i] = static_cast<T>(p[i]);
      else out[i] = static_cast<T>(cpu::to_acc(p[i]));
    }
  });
  return out;
}

template <class T>
T Tensor::item() const {
  LOOM_CHECK(numel() == 1, "item: tensor of shape ", shape(), " has ", numel(), " elements, not 1");
  return to_vector<T>()[0];
}

#define LOOM_INSTANTIATE(T) \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template T Tensor::item<T>() const;
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
LOOM_INSTANTIATE(int32_t)
LOOM_INSTANTIATE(int64_t)
#undef LOOM_INSTANTIATE

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return shape_str(shape()) + " " + dtype_name(dtype());
}

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  if (numel() <= 64) {
    std::vector<double> v = to_vector<double>();
    // Nested brackets, row-major.
    Shape st = contiguous_strides(shape());
    std::function<void(int64_t, int64_t)> rec = [&](int64_t d, int64_t base) {
      if (d == dim()) { os << v[size_t(base)]; return; }
      os << "[";
      for (int64_t i = 0; i < shape()[d]; ++i) {
        if (i) os << ", ";
        rec(d + 1, base + i * st[d]);
      }
      os << "]";
    };
    rec(0, 0);
    os << ", ";
  } else {
    os << "shape=" << shape_str(shape()) << ", ";
  }
  os << dtype_name(dtype()) << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---- creation ----------------------------------------------------------------

Tensor empty(const Shape& shape, DType dtype, const Device& device) {
  int64_t numel = 1;
  for (int64_t s : shape) {
    LOOM_CHECK(s >= 0, "empty: negative dimension in shape ", shape);
    LOOM_CHECK(s == 0 || numel <= std::numeric_limits<int64_t>::max() / int64_t(element_size(dtype)) / s,
               "empty: a tensor of shape ", shape, " and dtype ", dtype_name(dtype), " has more bytes than fit in 64 bits");
    numel *= s;
  }
  auto impl = std::make_shared<TensorImpl>();
  const size_t bytes = size_t(numel) * element_size(dtype);
  try {
    impl->storage = std::make_shared<Storage>(bytes, device);
  } catch (const std::bad_alloc&) {
    throw Error(str("out of memory: a tensor of shape ", shape, " and dtype ", dtype_name(dtype), " needs ", bytes,
                    " bytes on ", device.str(), ", where loom already holds ", memory_stats(device).live_bytes,
                    " live bytes"));
  }
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor zeros(const Shape& shape, DType dtype, const Device& device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cuda()) ops::zero_(t);
  else std::memset(t.raw_data(), 0, t.nbytes());  // all-zero bits are 0 in every dtype
  return t;
}

Tensor full(const Shape& shape, double value, DType dtype, const Device& device) {
  Tensor t = empty(shape, dtype, device);
  ops::fill_(t, value);
  return t;
}

Tensor ones(const Shape& shape, DType dtype, const Device& device) { return full(shape, 1.0, dtype, device); }

Tensor arange(int64_t end, DType dtype) {
  LOOM_CHECK(end >= 0, "arange: end ", end, " is negative");
  std::vector<int64_t> v(static_cast<size_t>(end));
  for (int64_t i = 0; i < end; ++i) v[size_t(i)] = i;
  return ops::to(from_vector(v), dtype);
}

Tensor arange(double start, double end, double step, DType dtype) {
  LOOM_CHECK(step != 0, "arange: step is zero");
  int64_t n = int64_t(std::ceil((end - start) / step));
  if (n < 0) n = 0;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + double(i) * step;
  return ops::to(from_vector(v), dtype);
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }

template <class T>
Tensor from_vector(const std::vector<T>& values, Shape shape) {
  if (shape.empty()) shape = {int64_t(values.size())};  // also [0] for no values: arange(0)
  LOOM_CHECK(numel_of(shape) == int64_t(values.size()), "from_vector: ", values.size(),
             " values do not fill shape ", shape, " (", numel_of(shape), " elements)");
  Tensor t = empty(shape, dtype_of<T>());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}
template Tensor from_vector<float>(const std::vector<float>&, Shape);
template Tensor from_vector<double>(const std::vector<double>&, Shape);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, Shape);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, Shape);
template Tensor from_vector<bfloat16>(const std::vector<bfloat16>&, Shape);
template Tensor from_vector<float16>(const std::vector<float16>&, Shape);

Tensor tensor(std::initializer_list<double> values, Shape shape, DType dtype) {
  return ops::to(from_vector(std::vector<double>(values), std::move(shape)), dtype);
}

}  // namespace loom
