// Internal to tensor/: the strided loop every elementwise op runs on.
// K operands (output first) share one iteration shape; each has its own element
// strides (0 on broadcast dims). Adjacent dims that are contiguous for every
// operand are merged first, so the common all-contiguous case is a single flat
// loop the compiler vectorises. When every operand is contiguous with the
// output's shape (the usual case) the loops skip that setup entirely: for small
// tensors the setup, not the math, is the cost of an op (bench/op_overhead).
// Large contiguous loops are split over the math threads (cpu/parallel.h).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "tensor/cpu/parallel.h"
#include "tensor/tensor.h"

namespace loom::cpu {

// Strides of `t` seen as broadcast to `shape` (0 where t has size 1 or is missing).
inline Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape st(shape.size(), 0);
  int64_t off = int64_t(shape.size()) - t.dim();
  for (int64_t i = 0; i < t.dim(); ++i)
    st[size_t(off + i)] = t.shape()[size_t(i)] == 1 ? 0 : t.strides()[size_t(i)];
  return st;
}

// True when every operand is contiguous and has exactly out's shape: the op is
// then one flat loop over numel elements, with no broadcasting or striding.
template <class... Ts>
bool same_contiguous_layout(const Tensor& out, const Ts&... in) {
  return out.is_contiguous() && ((in.shape() == out.shape() && in.is_contiguous()) && ...);
}

// Calls row(n, ptrs, inner_strides) once per innermost run of n elements.
// kDisjointRows: no two rows write the same output element, so rows may run on
// different threads (elementwise ops; not reductions).
template <size_t K, bool kDisjointRows = false, class Row>
void strided_loop(Shape shape, std::array<Shape, K> strides, std::array<char*, K> base,
                  std::array<int64_t, K> elem_size, Row&& row) {
  // Merge dim i into dim i+1 when every operand is contiguous across them.
  for (int64_t i = int64_t(shape.size()) - 2; i >= 0; --i) {
    bool ok = true;
    for (size_t k = 0; k < K; ++k)
      if (strides[k][size_t(i)] != strides[k][size_t(i + 1)] * shape[size_t(i + 1)]) ok = false;
    if (ok || shape[size_t(i)] == 1) {
      shape[size_t(i + 1)] *= shape[size_t(i)];
      shape.erase(shape.begin() + i);
      for (size_t k = 0; k < K; ++k) strides[k].erase(strides[k].begin() + i);
    }
  }
  if (shape.empty()) {  // 0-d
    shape.push_back(1);
    for (auto& s : strides) s.push_back(0);
  }
  for (int64_t s : shape) if (s == 0) return;
  const size_t nd = shape.size();
  const int64_t inner = shape[nd - 1];
  std::array<int64_t, K> inner_stride;
  for (size_t k = 0; k < K; ++k) inner_stride[k] = strides[k][nd - 1];
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < nd; ++d) outer *= shape[d];
  // Byte steps of each operand along each outer dim.
  std::array<Shape, K> step;
  for (size_t k = 0; k < K; ++k) {
    step[k].resize(nd);
    for (size_t d = 0; d < nd; ++d) step[k][d] = strides[k][d] * elem_size[k];
  }
  auto rows = [&](int64_t o0, int64_t o1) {  // outer rows o0..o1
    std::vector<int64_t> idx(nd, 0);
    for (int64_t d = int64_t(nd) - 2, rem = o0; d >= 0; --d) {
      idx[size_t(d)] = rem % shape[size_t(d)];
      rem /= shape[size_t(d)];
    }
    std::array<char*, K> p = base;
    for (size_t k = 0; k < K; ++k)
      for (size_t d = 0; d + 1 < nd; ++d) p[k] += idx[d] * step[k][d];
    for (int64_t o = o0; o < o1; ++o) {
      row(inner, p, inner_stride);
      for (int64_t d = int64_t(nd) - 2; d >= 0; --d) {  // odometer increment, pointers follow
        if (++idx[size_t(d)] < shape[size_t(d)]) {
          for (size_t k = 0; k < K; ++k) p[k] += step[k][size_t(d)];
          break;
        }
        idx[size_t(d)] = 0;
        for (size_t k = 0; k < K; ++k) p[k] -= (shape[size_t(d)] - 1) * step[k][size_t(d)];
      }
    }
  };
  // Rows go to different threads only when each writes its own outputs:
  // elementwise ops whose output (operand 0) has no broadcast (stride-0) dim;
  // never a reduction (several rows add into one output).
  bool disjoint = kDisjointRows;
  for (size_t d = 0; d + 1 < nd; ++d) disjoint = disjoint && strides[0][d] != 0;
  if (disjoint) parallel_for(outer, std::max<int64_t>(1, kElementwiseGrain / inner), rows);
  else rows(0, outer);
}

// The contiguous inner loops, each a function of its own. Inlined into the
// op, the loop's copy on the calling thread (one math thread, or a small
// tensor) sat in a large function - the op's dtype switch around several
// loops - where GCC 12 left some of them scalar while vectorising the same
// loop in OpenMP's outlined copy: GELU ran 2.8 ms for a [1024, 512] tensor at
// one thread against 0.26 ms (bench_gpt_step --profile: 16% of the small
// step). Alone in a small function, every copy vectorises.
template <class O, class A, class F>
[[gnu::noinline]] void unary_contiguous(O* o, const A* x, int64_t n, const F& f) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
}
template <class O, class A, class B, class F>
[[gnu::noinline]] void binary_contiguous(O* o, const A* x, const B* y, int64_t n, const F& f) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
}

// out = f(a) elementwise, out and a of types O and A, f on compute values.
template <class O, class A, class F>
void unary_loop(const Tensor& out, const Tensor& a, F f) {
  auto row = [&](int64_t n, std::array<char*, 2> p, std::array<int64_t, 2> s) {
    O* o = reinterpret_cast<O*>(p[0]);
    const A* x = reinterpret_cast<const A*>(p[1]);
    if (s[0] == 1 && s[1] == 1) {
      unary_contiguous(o, x, n, f);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(x[i * s[1]]);
    }
  };
  std::array<char*, 2> base{static_cast<char*>(out.raw_data()), static_cast<char*>(a.raw_data())};
  if (same_contiguous_layout(out, a)) {
    parallel_for(out.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
      row(e - b, {base[0] + b * int64_t(sizeof(O)), base[1] + b * int64_t(sizeof(A))}, {1, 1});
    });
    return;
  }
  strided_loop<2, true>(out.shape(), {out.strides(), broadcast_strides(a, out.shape())}, base,
                        {int64_t(sizeof(O)), int64_t(sizeof(A))}, row);
}

// out = f(a, b) elementwise with broadcasting.
template <class O, class A, class B, class F>
void binary_loop(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  auto row = [&](int64_t n, std::array<char*, 3> p, std::array<int64_t, 3> s) {
    O* o = reinterpret_cast<O*>(p[0]);
    const A* x = reinterpret_cast<const A*>(p[1]);
    const B* y = reinterpret_cast<const B*>(p[2]);
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      binary_contiguous(o, x, y, n, f);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(x[i * s[1]], y[i * s[2]]);
    }
  };
  std::array<char*, 3> base{static_cast<char*>(out.raw_data()), static_cast<char*>(a.raw_data()),
                            static_cast<char*>(b.raw_data())};
  if (same_contiguous_layout(out, a, b)) {
    parallel_for(out.numel(), kElementwiseGrain, [&](int64_t i, int64_t e) {
      row(e - i, {base[0] + i * int64_t(sizeof(O)), base[1] + i * int64_t(sizeof(A)), base[2] + i * int64_t(sizeof(B))},
          {1, 1, 1});
    });
    return;
  }
  strided_loop<3, true>(out.shape(),
                        {out.strides(), broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape())}, base,
                        {int64_t(sizeof(O)), int64_t(sizeof(A)), int64_t(sizeof(B))}, row);
}

// out = f(a, b, c) elementwise with broadcasting (where).
template <class O, class A, class B, class C, class F>
void ternary_loop(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, F f) {
  auto row = [&](int64_t n, std::array<char*, 4> p, std::array<int64_t, 4> s) {
    O* o = reinterpret_cast<O*>(p[0]);
    const A* x = reinterpret_cast<const A*>(p[1]);
    const B* y = reinterpret_cast<const B*>(p[2]);
    const C* z = reinterpret_cast<const C*>(p[3]);
    for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(x[i * s[1]], y[i * s[2]], z[i * s[3]]);
  };
  std::array<char*, 4> base{static_cast<char*>(out.raw_data()), static_cast<char*>(a.raw_data()),
                            static_cast<char*>(b.raw_data()), static_cast<char*>(c.raw_data())};
  if (same_contiguous_layout(out, a, b, c)) {
    parallel_for(out.numel(), kElementwiseGrain, [&](int64_t i, int64_t e) {
      row(e - i,
          {base[0] + i * int64_t(sizeof(O)), base[1] + i * int64_t(sizeof(A)), base[2] + i * int64_t(sizeof(B)),
           base[3] + i * int64_t(sizeof(C))},
          {1, 1, 1, 1});
    });
    return;
  }
  strided_loop<4, true>(out.shape(),
                        {out.strides(), broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape()),
                         broadcast_strides(c, out.shape())},
                        base, {int64_t(sizeof(O)), int64_t(sizeof(A)), int64_t(sizeof(B)), int64_t(sizeof(C))},
                        row);
}

}  // namespace loom::cpu
