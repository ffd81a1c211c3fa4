// safetensors read/write (format in safetensors.h); the header's JSON goes
// through nn/json.h.
#include "nn/safetensors.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include <unistd.h>

#include "nn/json.h"
#include "tensor/ops.h"

namespace loom::nn {

using json::Json;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; loom assumes a little-endian host");

std::string safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::Float64: return "F64";
    case DType::Float32: return "F32";
    case DType::BFloat16: return "BF16";
    case DType::Float16: return "F16";
    case DType::Int32: return "I32";
    case DType::Int64: return "I64";
  }
  throw Error("safetensors: unknown dtype");
}

namespace {

bool dtype_from_safetensors(const std::string& s, DType& out) {
  for (DType d : {kFloat64, kFloat32, kBFloat16, kFloat16, kInt32, kInt64})
    if (safetensors_dtype(d) == s) { out = d; return true; }
  return false;
}

using File = std::unique_ptr<FILE, int (*)(FILE*)>;

}  // namespace

// ---- save -------------------------------------------------------------------------

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // The header first: every entry's offsets follow from the shapes alone.
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ',';
      header += json::quote(k);
      header += ':';
      header += json::quote(v);
      first = false;
    }
    header += "},";
  }
  std::set<std::string> names;
  std::vector<Tensor> data;  // contiguous CPU tensors, in file order
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(!name.empty() && name != "__metadata__", "save_safetensors: ", path, ": invalid tensor name '", name, "'");
    LOOM_CHECK(names.insert(name).second, "save_safetensors: ", path, ": tensor '", name, "' appears twice");
    LOOM_CHECK(t.defined(), "save_safetensors: ", path, ": tensor '", name, "' is undefined");
    LOOM_CHECK(t.device().is_cpu(), "save_safetensors: ", path, ": tensor '", name, "' is on ", t.device().str(),
               "; copy it to the CPU first");
    data.push_back(ops::contiguous(t));
    std::string shape;
    for (int64_t d : t.shape()) {
      if (!shape.empty()) shape += ',';
      shape += std::to_string(d);
    }
    // (Appended piece by piece: GCC 12 warns falsely on long `a + b + c` string chains.)
    header += json::quote(name);
    header += str(":{\"dtype\":\"", safetensors_dtype(t.dtype()), "\",\"shape\":[", shape, "],\"data_offsets\":[",
                  offset, ",", offset + t.nbytes(), "]},");
    offset += t.nbytes();
  }
  if (header.back() == ',') header.pop_back();
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned

  // Then the bytes, into path.tmp; only a complete, flushed file is renamed over path.
  const std::string tmp = path + ".tmp";
  File f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  LOOM_CHECK(f, "save_safetensors: cannot open ", tmp, " for writing: ", std::strerror(errno));
  auto fail = [&](const char* what) {
    int err = errno;
    f.reset();
    std::remove(tmp.c_str());
    throw Error(str("save_safetensors: ", what, " (", tmp, "): ", std::strerror(err), "; ", path, " is unchanged"));
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, f.get()) != 8) fail("cannot write");
  if (std::fwrite(header.data(), 1, header.size(), f.get()) != header.size()) fail("cannot write");
  for (const Tensor& t : data)
    if (t.nbytes() && std::fwrite(t.raw_data(), 1, t.nbytes(), f.get()) != t.nbytes()) fail("cannot write");
  if (std::fflush(f.get()) != 0 || fsync(fileno(f.get())) != 0) fail("cannot flush");
  if (std::fclose(f.release()) != 0) fail("cannot close");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename over the destination");
}

// ---- load -------------------------------------------------------------------------

bool SafetensorsFile::contains(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  throw Error(str("safetensors: ", path, ": no tensor named '", name, "'"));
}

SafetensorsFile load_safetensors(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"), &std::fclose);
  LOOM_CHECK(f, "load_safetensors: cannot open ", path, ": ", std::strerror(errno));
  LOOM_CHECK(std::fseek(f.get(), 0, SEEK_END) == 0, "load_safetensors: ", path, ": cannot seek");
  const uint64_t file_size = uint64_t(std::ftell(f.get()));
  std::rewind(f.get());

  LOOM_CHECK(file_size >= 8, "load_safetensors: ", path, ": truncated file (", file_size,
             " bytes, less than the 8-byte header length)");
  uint8_t len[8];
  LOOM_CHECK(std::fread(len, 1, 8, f.get()) == 8, "load_safetensors: ", path, ": cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  LOOM_CHECK(n <= file_size - 8, "load_safetensors: ", path, ": truncated file (header length ", n,
             " bytes, but only ", file_size - 8, " bytes follow it)");
  std::string header(size_t(n), '\0');
  LOOM_CHECK(std::fread(header.data(), 1, header.size(), f.get()) == header.size(), "load_safetensors: ", path,
             ": cannot read the header");
  const uint64_t data_start = 8 + n, data_size = file_size - data_start;

  Json root = json::parse(header, str("load_safetensors: ", path, ": malformed JSON header"));
  LOOM_CHECK(root.kind == Json::Object, "load_safetensors: ", path, ": the header is not a JSON object");

  SafetensorsFile out;
  out.path = path;
  std::set<std::string> names;
  for (const auto& [name, entry] : root.members) {
    auto bad = [&](const std::string& what) {
      return Error(str("load_safetensors: ", path, ": tensor '", name, "': ", what));
    };
    if (name == "__metadata__") {
      if (entry.kind != Json::Object) throw bad("__metadata__ must be an object of strings");
      for (const auto& [k, v] : entry.members) {
        if (v.kind != Json::String) throw bad("metadata value '" + k + "' is not a string");
        out.metadata[k] = v.text;
      }
      continue;
    }
    if (!names.insert(name).second) throw bad("appears twice in the header");
    if (entry.kind != Json::Object) throw bad("entry is not an object");
    auto field = [&](const char* key) -> const Json& {
      for (const auto& [k, v] : entry.members)
        if (k == key) return v;
      throw bad(str("missing field \"", key, "\""));
    };
    auto as_uint = [&](const Json& v, const char* what) {
      if (v.kind != Json::Number || v.text.empty() || v.text.size() > 19 ||
          v.text.find_first_not_of("0123456789") != std::string::npos)
        throw bad(str(what, " must be a non-negative integer, got '", v.text, "'"));
      return uint64_t(std::stoull(v.text));
    };

    const Json& dtype_json = field("dtype");
    DType dtype = kFloat32;
    if (dtype_json.kind != Json::String || !dtype_from_safetensors(dtype_json.text, dtype))
      throw bad("unknown dtype '" + dtype_json.text + "' (loom reads F64, F32, BF16, F16, I32, I64)");

    const Json& shape_json = field("shape");
    if (shape_json.kind != Json::Array) throw bad("shape must be an array");
    Shape shape;
    uint64_t numel = 1;
    for (const Json& d : shape_json.items) {
      uint64_t s = as_uint(d, "shape entries");
      if (s != 0 && numel > (uint64_t(1) << 56) / s) throw bad("shape is too large");
      numel *= s;
      shape.push_back(int64_t(s));
    }

    const Json& off = field("data_offsets");
    if (off.kind != Json::Array || off.items.size() != 2) throw bad("data_offsets must be [begin, end]");
    const uint64_t begin = as_uint(off.items[0], "data_offsets"), end = as_uint(off.items[1], "data_offsets");
    const uint64_t nbytes = numel * element_size(dtype);
    if (end < begin || end - begin != nbytes)
      throw bad(str("data_offsets [", begin, ", ", end, "] do not match shape ", shape, " of ", dtype_json.text, " (",
                    nbytes, " bytes)"));
    if (end > data_size)
      throw bad(str("truncated file: data [", begin, ", ", end, ") lies beyond the ", data_size,
                    " bytes of data in the file"));

    Tensor t = empty(shape, dtype);
    if (nbytes) {
      if (std::fseek(f.get(), long(data_start + begin), SEEK_SET) != 0 ||
          std::fread(t.raw_data(), 1, size_t(nbytes), f.get()) != nbytes)
        throw bad("cannot read its data");
    }
    out.tensors.emplace_back(name, t);
  }
  return out;
}

}  // namespace loom::nn
