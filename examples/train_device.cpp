#include "examples/train_device.h"

#include "autograd/variable.h"
#include "tensor/cuda/cuda.h"
#include "tensor/ops.h"

namespace loom::train {

void move_to_device(ModelOrStage& m, const Args& a) {
  const Device device(a.device);
  if (device.is_cpu()) return;
  cuda::set_allow_tf32(a.tf32);
  // In place (set_data): the tensors keep their identity, so the tied wte stays one tensor.
  for (const auto& entry : m.net().named_parameters())
    ops::set_data(entry.second, ops::to(autograd::detach(entry.second), device));
}

void to_device(std::vector<data::Batch>& mbs, const Args& a) {
  const Device device(a.device);
  if (device.is_cpu()) return;
  for (data::Batch& b : mbs) b = {ops::to(b.x, device), ops::to(b.y, device)};
}

}  // namespace loom::train
