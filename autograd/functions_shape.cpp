// Backward formulas of views, copies, joins and indexing. A view's gradient is
// the inverse re-description (reshape back, transpose back, pad a narrow with
// zeros); an index op's gradient scatters back (index_add, scatter_add).
#include "autograd/function.h"
#include "autograd/functions.h"

namespace loom::autograd {

Tensor view(const Tensor& x, const Shape& shape) {
  return record("ViewBackward", {&x}, ops::view(x, shape), [s = x.shape()](const TensorList& g) {
    return TensorList{ops::reshape(g[0], s)};
  });
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  return record("ReshapeBackward", {&x}, ops::reshape(x, shape), [s = x.shape()](const TensorList& g) {
    return TensorList{ops::reshape(g[0], s)};
  });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  return record("TransposeBackward", {&x}, ops::transpose(x, d0, d1), [d0, d1](const TensorList& g) {
    return TensorList{ops::transpose(g[0], d0, d1)};
  });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  return record("PermuteBackward", {&x}, ops::permute(x, dims), [dims, n = x.dim()](const TensorList& g) {
    std::vector<int64_t> inv(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inv[size_t(dims[i] < 0 ? dims[i] + n : dims[i])] = int64_t(i);
    return TensorList{ops::permute(g[0], inv)};
  });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  return record("NarrowBackward", {&x}, ops::narrow(x, dim, start, length),
                [shape = x.shape(), dim, start, length](const TensorList& g) {
                  Tensor gx = zeros(shape, g[0].dtype(), g[0].device());
                  ops::copy_(ops::narrow(gx, dim, start, length), g[0]);
                  return TensorList{gx};
                });
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  return record("UnsqueezeBackward", {&x}, ops::unsqueeze(x, dim), [s = x.shape()](const TensorList& g) {
    return TensorList{ops::reshape(g[0], s)};
  });
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  return record("SqueezeBackward", {&x}, ops::squeeze(x, dim), [s = x.shape()](const TensorList& g) {
    return TensorList{ops::reshape(g[0], s)};
  });
}

Tensor expand(const Tensor& x, const Shape& shape) {
  return record("ExpandBackward", {&x}, ops::expand(x, shape), [s = x.shape()](const TensorList& g) {
    return TensorList{ops::sum_to(g[0], s)};
  });
}

Tensor contiguous(const Tensor& x) {
  return record("ContiguousBackward", {&x}, ops::contiguous(x), [](const TensorList& g) { return TensorList{g[0]}; });
}

Tensor clone(const Tensor& x) {
  return record("CloneBackward", {&x}, ops::clone(x), [](const TensorList& g) { return TensorList{g[0]}; });
}

Tensor to(const Tensor& x, DType dtype) {
  return record("ToBackward", {&x}, ops::to(x, dtype), [dt = x.dtype()](const TensorList& g) {
    return TensorList{ops::to(g[0], dt)};
  });
}

Tensor cat(const TensorList& xs, int64_t dim) {
  Tensor out = ops::cat(xs, dim);
  std::vector<int64_t> sizes;
  for (const Tensor& x : xs) sizes.push_back(x.size(dim));
  return record("CatBackward", xs, out, [sizes, dim](const TensorList& g) {
    TensorList gs;
    int64_t at = 0;
    for (int64_t n : sizes) {
      gs.push_back(ops::narrow(g[0], dim, at, n));
      at += n;
    }
    return gs;
  });
}

TensorList split(const Tensor& x, int64_t split_size, int64_t dim) {
  TensorList parts = ops::split(x, split_size, dim);  // views
  if (!any_requires_grad({&x})) return parts;
  // One node with an output per part (attention splits qkv into q, k, v):
  // backward writes each part's gradient into its slice of one buffer, zeros
  // where a part got none. A narrow node per part would build a zero-padded
  // full-size gradient for each and leave the engine to add them up.
  std::vector<int64_t> sizes;
  for (const Tensor& p : parts) sizes.push_back(p.size(dim));
  auto node = std::make_shared<FunctionNode>(
      "SplitBackward", [shape = x.shape(), dtype = x.dtype(), device = x.device(), sizes, dim](const TensorList& g) {
        // The parts' gradients already side by side in one buffer (causal attention's dq, dk, dv): that
        // buffer is x's gradient, no copy.
        if (g.size() == sizes.size()) {
          Tensor whole = ops::cat_view(g, dim);
          if (whole.defined() && whole.shape() == shape && whole.dtype() == dtype) return TensorList{whole};
        }
        Tensor gx = empty(shape, dtype, device);
        int64_t at = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
          Tensor slice = ops::narrow(gx, dim, at, sizes[i]);
          if (i < g.size() && g[i].defined()) ops::copy_(slice, g[i]);
          else ops::zero_(slice);
          at += sizes[i];
        }
        return TensorList{gx};
      });
  node->num_outputs = int(parts.size());
  node->next_edges.push_back(gradient_edge(x));
  for (size_t i = 0; i < parts.size(); ++i) {
    AutogradMeta& m = meta(parts[i]);
    m.grad_fn = node;
    m.output_nr = int(i);
  }
  return parts;
}

Tensor stack(const TensorList& xs, int64_t dim) {
  TensorList us;
  for (const Tensor& x : xs) us.push_back(unsqueeze(x, dim));
  return cat(us, dim);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx) {
  return record("IndexSelectBackward", {&x}, ops::index_select(x, dim, idx), [x, dim, idx](const TensorList& g) {
    return TensorList{ops::index_add(x, dim, idx, g[0])};
  });
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx) {
  return record("GatherBackward", {&x}, ops::gather(x, dim, idx), [s = x.shape(), dim, idx](const TensorList& g) {
    return TensorList{ops::scatter_add(s, dim, idx, g[0])};
  });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return record("WhereBackward", {&a, &b}, ops::where(cond, a, b), [cond, sa = a.shape(), sb = b.shape()](const TensorList& g) {
    Tensor z = zeros({}, g[0].dtype(), g[0].device());
    return TensorList{ops::sum_to(ops::where(cond, g[0], z), sa), ops::sum_to(ops::where(cond, z, g[0]), sb)};
  });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return record("MaskedFillBackward", {&x}, ops::masked_fill(x, mask, value), [mask, s = x.shape()](const TensorList& g) {
    return TensorList{ops::sum_to(ops::masked_fill(g[0], mask, 0.0), s)};
  });
}

Tensor causal_mask_fill(const Tensor& x, double value) {
  return record("CausalMaskBackward", {&x}, ops::causal_mask_fill(x, value), [](const TensorList& g) {
    return TensorList{ops::causal_mask_fill(g[0], 0.0)};
  });
}

}  // namespace loom::autograd
