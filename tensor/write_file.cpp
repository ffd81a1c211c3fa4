#include "tensor/write_file.h"

#include <filesystem>
#include <fstream>

#include "tensor/error.h"

namespace loom {

void write_file_atomically(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(f.good(), what, ": cannot write '", tmp, "'");
    f << text;
    LOOM_CHECK(f.good(), what, ": error writing '", tmp, "'");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace loom
