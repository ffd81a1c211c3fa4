// The fuzz targets' shared step: the input bytes written to a file of their own
// (the readers take a path), one per process and name.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace loom::fuzz {

// Writes data to /tmp/loom_fuzz_<pid>/<name> (the folder made once) and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = "/tmp/loom_fuzz_" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  const std::string path = (dir / name).string();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace loom::fuzz
