#include "tensor/device.h"

#include <cstddef>

#include "tensor/error.h"

namespace loom {

Device::Device(const std::string& name) {
  if (name == "cpu") { type = DeviceType::CPU; index = 0; return; }
  if (name.rfind("cuda", 0) == 0) {
    type = DeviceType::CUDA;
    index = 0;
    if (name.size() > 4) {
      LOOM_CHECK(name[4] == ':' && name.size() > 5, "device: cannot parse '", name, "' (expected cpu, cuda or cuda:N)");
      size_t used = 0;
      try { index = std::stoi(name.substr(5), &used); } catch (...) {
        throw Error(loom::str("device: cannot parse '", name, "' (expected cpu, cuda or cuda:N)"));
      }
      LOOM_CHECK(used == name.size() - 5, "device: cannot parse '", name, "' (expected cpu, cuda or cuda:N)");
      LOOM_CHECK(index >= 0, "device: negative index in '", name, "'");
    }
    return;
  }
  throw Error(loom::str("device: cannot parse '", name, "' (expected cpu, cuda or cuda:N)"));
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

bool built_with_cuda() {
#ifdef LOOM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void check_device_supported(const char* op, const Device& d) {
  if (d.is_cpu()) return;
  if (!built_with_cuda())
    throw Error(str(op, ": device ", d.str(), " requested but loom was built without CUDA (configure with -DLOOM_CUDA=ON)"));
  throw Error(str("not implemented on CUDA yet: ", op, " (a tensor on ", d.str(), "; copy it to the CPU with ops::to(t, kCPU))"));
}

}  // namespace loom
