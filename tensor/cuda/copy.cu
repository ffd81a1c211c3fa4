// Copies on one GPU: copy_on_device (strided, broadcast, dtype-converting: the
// kernel behind contiguous(), clone(), to(dtype) and cat), fill_, zero_, where.
// One kernel each, with the dtypes as runtime arguments rather than template
// parameters: 36 (dst, src) dtype pairs would be 36 kernels to compile, and a
// copy is bound by memory, not by a switch.
//
// Conversions follow the CPU's (cpu/dispatch.h): the same dtype is copied
// bit for bit; otherwise the value goes through double (exact for every
// source dtype except int64 beyond 2^53, as on the CPU) and is rounded to the
// destination, bf16/fp16 by way of float.
#include <cstring>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/launch.cuh"

namespace loom::cuda {
namespace {

__device__ __forceinline__ double load_as_double(const char* p, DType t) {
  switch (t) {
    case DType::Float64: return *reinterpret_cast<const double*>(p);
    case DType::Float32: return double(*reinterpret_cast<const float*>(p));
    case DType::BFloat16: return double(bf16_to_float(*reinterpret_cast<const bfloat16*>(p)));
    case DType::Float16: return double(fp16_to_float(*reinterpret_cast<const float16*>(p)));
    case DType::Int32: return double(*reinterpret_cast<const int32_t*>(p));
    case DType::Int64: return double(*reinterpret_cast<const int64_t*>(p));
  }
  return 0;
}

__device__ __forceinline__ void store_from_double(char* p, DType t, double v) {
  switch (t) {
    case DType::Float64: *reinterpret_cast<double*>(p) = v; break;
    case DType::Float32: *reinterpret_cast<float*>(p) = float(v); break;
    case DType::BFloat16: *reinterpret_cast<bfloat16*>(p) = float_to_bf16(float(v)); break;
    case DType::Float16: *reinterpret_cast<float16*>(p) = float_to_fp16(float(v)); break;
    case DType::Int32: *reinterpret_cast<int32_t*>(p) = int32_t(v); break;
    case DType::Int64: *reinterpret_cast<int64_t*>(p) = int64_t(v); break;
  }
}

// dst[i] = convert(src[i]); offsets in elements, sizes in bytes.
__global__ void copy_kernel(char* dst, DType dt, int dst_bytes, const char* src, DType st, int src_bytes,
                            Offsets<2> ix, int64_t n) {
  LOOM_GRID_STRIDE_LOOP(i, n) {
    int64_t o[2];
    ix.get(i, o);
    char* d = dst + o[0] * dst_bytes;
    const char* s = src + o[1] * src_bytes;
    if (dt == st) copy_element(d, s, dst_bytes);
    else store_from_double(d, dt, load_as_double(s, st));
  }
}

// t[i] = the element whose bytes are `bits` (the value already in t's dtype).
__global__ void fill_kernel(char* t, int bytes, uint64_t bits, Offsets<1> ix, int64_t n) {
  LOOM_GRID_STRIDE_LOOP(i, n) {
    int64_t o[1];
    ix.get(i, o);
    copy_element(t + o[0] * bytes, reinterpret_cast<const char*>(&bits), bytes);
  }
}

// out[i] = cond[i] != 0 ? a[i] : b[i]; a, b and out share a dtype of `bytes` bytes.
__global__ void where_kernel(char* out, const char* cond, DType ct, int cond_bytes, const char* a, const char* b,
                             int bytes, Offsets<4> ix, int64_t n) {
  LOOM_GRID_STRIDE_LOOP(i, n) {
    int64_t o[4];
    ix.get(i, o);
    const bool take_a = load_as_double(cond + o[1] * cond_bytes, ct) != 0;
    copy_element(out + o[0] * bytes, take_a ? a + o[2] * bytes : b + o[3] * bytes, bytes);
  }
}

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

}  // namespace

void copy_on_device(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(dst.device() == src.device(), "copy_: internal error: ", dst.device().str(), " and ",
             src.device().str());
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device());
  cudaStream_t s = stream(dst.device());
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape()) {
    if (dst.raw_data() != src.raw_data()) {
      CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, s));
      count_launch();  // the GPU runs a device copy as a kernel (launch_count.h)
    }
    return;
  }
  auto ix = make_offsets<2>("copy_", dst.shape(), {dst.strides(), broadcast_strides(src, dst.shape())});
  LaunchConfig c = launch_config(n);
  copy_kernel<<<c.blocks, c.threads, 0, s>>>(bytes_of(dst), dst.dtype(), int(element_size(dst.dtype())),
                                             bytes_of(src), src.dtype(), int(element_size(src.dtype())), ix, n);
  CUDA_CHECK_LAUNCH();
}

void fill_(const Tensor& t, double value) {
  const int64_t n = t.numel();
  if (n == 0) return;
  uint64_t bits = 0;  // value rounded to t's dtype on the host, as the CPU fill_ does
  LOOM_DISPATCH_ALL(t.dtype(), "fill_", {
    scalar_t v = cpu::from_acc<scalar_t>(value);
    std::memcpy(&bits, &v, sizeof v);
  });
  DeviceGuard guard(t.device());
  auto ix = make_offsets<1>("fill_", t.shape(), {t.strides()});
  LaunchConfig c = launch_config(n);
  fill_kernel<<<c.blocks, c.threads, 0, stream(t.device())>>>(bytes_of(t), int(element_size(t.dtype())), bits, ix,
                                                               n);
  CUDA_CHECK_LAUNCH();
}

void zero_(const Tensor& t) {
  if (!t.is_contiguous()) return fill_(t, 0.0);
  if (t.numel() == 0) return;
  DeviceGuard guard(t.device());
  CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), stream(t.device())));  // all-zero bits are 0 in every dtype
  count_launch();  // a memset is a kernel on the GPU (launch_count.h)
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& shape) {
  LOOM_CHECK(cond.device() == a.device() && b.device() == a.device(), "where: devices differ: condition on ",
             cond.device().str(), ", values on ", a.device().str(), " and ", b.device().str());
  Tensor out = empty(shape, a.dtype(), a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  DeviceGuard guard(a.device());
  auto ix = make_offsets<4>("where", shape,
                            {out.strides(), broadcast_strides(cond, shape), broadcast_strides(a, shape),
                             broadcast_strides(b, shape)});
  LaunchConfig c = launch_config(n);
  where_kernel<<<c.blocks, c.threads, 0, stream(a.device())>>>(bytes_of(out), bytes_of(cond), cond.dtype(),
                                                                int(element_size(cond.dtype())), bytes_of(a),
                                                                bytes_of(b), int(element_size(a.dtype())), ix, n);
  CUDA_CHECK_LAUNCH();
  return out;
}

}  // namespace loom::cuda
