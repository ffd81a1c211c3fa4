// Devices: cpu and cuda:N. Every op dispatches on device; the CPU path is
// always built, the CUDA path (tensor/cuda/) only when LOOM_CUDA is on.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(i) {}
  Device(const std::string& name);  // "cpu", "cuda", "cuda:1"
  Device(const char* name) : Device(std::string(name)) {}

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
};

inline const Device kCPU{DeviceType::CPU, 0};

// True when this build has the CUDA path (LOOM_CUDA=ON).
bool built_with_cuda();
// The dispatch point every op calls before touching data on the CPU path: CPU
// passes; a CUDA device throws "<op>: ... loom was built without CUDA" or, for
// an op that has no CUDA kernel yet, "not implemented on CUDA yet: <op>",
// naming the device. (Ops with a CUDA path branch to it before this call.)
void check_device_supported(const char* op, const Device& d);

}  // namespace loom
