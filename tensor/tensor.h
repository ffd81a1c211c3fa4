// Tensor: a cheap handle (shared_ptr<TensorImpl>) over shared Storage, with
// shape, strides, offset, dtype and device. Views (reshape, transpose, narrow,
// expand...) are new TensorImpls over the same Storage; see tensor/ops.h.
//
// The tensor layer knows nothing about gradients. TensorImpl has one opaque
// slot, `autograd_meta`, that autograd/ fills in (PyTorch's AutogradMeta
// design); the only thing the tensor layer asks of it is whether an in-place
// write is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace loom {

using Shape = std::vector<int64_t>;

// Implemented by autograd/. Kept abstract here so tensor/ does not depend on it.
struct AutogradMetaInterface {
  virtual ~AutogradMetaInterface() = default;
  // Throws if writing in place into this tensor would corrupt autograd
  // (a leaf that requires grad, while grad mode is on).
  virtual void check_inplace(const char* op) const = 0;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;   // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;
  std::shared_ptr<AutogradMetaInterface> autograd_meta;
};

int64_t numel_of(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t dim() const { return int64_t(impl_->shape.size()); }
  int64_t size(int64_t d) const;     // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return numel_of(impl_->shape); }
  int64_t offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  const Device& device() const { return impl_->storage->device(); }
  bool is_contiguous() const;
  size_t nbytes() const { return size_t(numel()) * element_size(dtype()); }

  // Raw pointer to element [0,...,0] (a device pointer for a CUDA tensor).
  void* raw_data() const;
  // The same for host code: checks that T matches dtype and that the tensor is
  // on the CPU (host code dereferencing a GPU pointer would crash; an op with
  // no CUDA path fails here with a message instead).
  template <class T> T* data() const {
    LOOM_CHECK(dtype_of<T>() == dtype(), "data<", dtype_name(dtype_of<T>()), ">: tensor has dtype ", dtype_name(dtype()));
    LOOM_CHECK(device().is_cpu(), "data<", dtype_name(dtype_of<T>()), ">: tensor ", describe(), " is on ", device().str(),
               ": host code cannot read GPU memory (not implemented on CUDA yet, or copy it with ops::to(t, kCPU))");
    return static_cast<T*>(raw_data());
  }

  // The single value of a one-element tensor, converted to T.
  template <class T = float> T item() const;
  // All values in row-major order, converted to T.
  template <class T = float> std::vector<T> to_vector() const;

  // A new handle on the same storage and view, with no autograd metadata.
  Tensor alias() const;

  // Throws if an in-place write into this tensor is not allowed (autograd).
  void check_inplace(const char* op) const {
    if (impl_->autograd_meta) impl_->autograd_meta->check_inplace(op);
  }

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  std::string str() const;  // "tensor([[1, 2], [3, 4]], float32)"; small tensors only print values
  std::string describe() const;  // "[2, 3] float32"

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- creation ----------------------------------------------------------------
Tensor empty(const Shape& shape, DType dtype = kFloat32, const Device& device = kCPU);
Tensor zeros(const Shape& shape, DType dtype = kFloat32, const Device& device = kCPU);
Tensor ones(const Shape& shape, DType dtype = kFloat32, const Device& device = kCPU);
Tensor full(const Shape& shape, double value, DType dtype = kFloat32, const Device& device = kCPU);
Tensor arange(int64_t end, DType dtype = kInt64);
Tensor arange(double start, double end, double step = 1.0, DType dtype = kFloat32);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);

// From host values: shape defaults to 1-D [values.size()].
template <class T>
Tensor from_vector(const std::vector<T>& values, Shape shape = {});
// Float list with an explicit dtype (values converted): tensor({1, 2, 3, 4}, {2, 2}).
Tensor tensor(std::initializer_list<double> values, Shape shape = {}, DType dtype = kFloat32);

}  // namespace loom
