// safetensors read/write (format in safetensors.h). The header's JSON is read
// and written by nlohmann/json (ordered_json: members stay in file order, so a
// header's tensor order survives a load); the layout around it is loom's.
#include "nn/safetensors.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "tensor/ops.h"

namespace loom::nn {

using Json = nlohmann::ordered_json;

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

// "<context> at byte 22: expected '}', found '"'" from nlohmann's
// "... parse error at line 1, column 29: syntax error while parsing object -
// unexpected string literal; expected '}'". nlohmann counts the bytes it read
// (e.byte, the end of the offending token); the error names where it begins.
Error malformed(const std::string& header, const Json::parse_error& e, const std::string& context) {
  size_t begin = header.size();  // past the end: the input ended too early
  if (e.byte >= 1 && e.byte <= header.size()) {
    begin = e.byte - 1;
    auto escaped = [&](size_t q) {  // is the quote at q preceded by an odd number of backslashes?
      size_t n = 0;
      while (q > n && header[q - n - 1] == '\\') ++n;
      return n % 2 == 1;
    };
    auto in_number = [&](size_t k) { return std::strchr("0123456789+-.eE", header[k]) && header[k] != '\0'; };
    if (header[begin] == '"' && begin > 0) {  // a string literal: back to its opening quote
      do --begin; while (begin > 0 && (header[begin] != '"' || escaped(begin)));
    } else if (in_number(begin)) {  // a number: back to its first character
      while (begin > 0 && in_number(begin - 1)) --begin;
    }
  }
  std::string what = e.what();
  if (size_t dash = what.find(" - "); dash != std::string::npos) what = what.substr(dash + 3);
  const size_t expected = what.find("; expected ");
  if (begin < header.size() && what.starts_with("unexpected ") && expected != std::string::npos)
    what = str(what.substr(expected + 2), ", found '", header[begin], "'");
  return Error(str(context, " at byte ", begin, ": ", what));
}

// The header as JSON. A tensor named twice is an error (nlohmann would keep the last).
Json parse_header(const std::string& header, const std::string& path) {
  std::set<std::string> names;
  auto refuse_duplicates = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second)
      throw Error(str("load_safetensors: ", path, ": tensor '", parsed.get<std::string>(),
                      "': appears twice in the header"));
    return true;
  };
  try {
    return Json::parse(header, refuse_duplicates);
  } catch (const Json::parse_error& e) {
    throw malformed(header, e, str("load_safetensors: ", path, ": malformed JSON header"));
  } catch (const Json::exception& e) {  // e.g. out_of_range 406: a number too large for any type (found by fuzz_safetensors)
    throw Error(str("load_safetensors: ", path, ": unreadable JSON header: ", e.what()));
  }
}

}  // namespace

// ---- save -------------------------------------------------------------------------

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // The header first: every entry's offsets follow from the shapes alone.
  Json header = Json::object();
  if (!metadata.empty()) {
    Json& meta = header["__metadata__"] = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
  }
  std::vector<Tensor> data;  // contiguous CPU tensors, in file order
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(!name.empty() && name != "__metadata__", "save_safetensors: ", path, ": invalid tensor name '", name, "'");
    LOOM_CHECK(!header.contains(name), "save_safetensors: ", path, ": tensor '", name, "' appears twice");
    LOOM_CHECK(t.defined(), "save_safetensors: ", path, ": tensor '", name, "' is undefined");
    LOOM_CHECK(t.device().is_cpu(), "save_safetensors: ", path, ": tensor '", name, "' is on ", t.device().str(),
               "; copy it to the CPU first");
    data.push_back(ops::contiguous(t));
    Json& entry = header[name] = Json::object();
    entry["dtype"] = safetensors_dtype(t.dtype());
    entry["shape"] = t.shape();
    entry["data_offsets"] = Json::array({offset, offset + t.nbytes()});
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();  // compact: {"__metadata__":{"k":"v"},"a":{"dtype":"F32",...}}
  } catch (const Json::type_error& e) {
    throw Error(str("save_safetensors: ", path, ": a tensor name or metadata entry is not valid UTF-8, which JSON "
                    "requires (", e.what(), ")"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned

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
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, f.get()) != 8) fail("cannot write");
  if (std::fwrite(text.data(), 1, text.size(), f.get()) != text.size()) fail("cannot write");
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

  const Json root = parse_header(header, path);
  LOOM_CHECK(root.is_object(), "load_safetensors: ", path, ": the header is not a JSON object");

  SafetensorsFile out;
  out.path = path;
  for (auto member = root.begin(); member != root.end(); ++member) {
    const std::string& name = member.key();  // (not a structured binding: clang 14 lambdas cannot capture one)
    const Json& entry = member.value();
    auto bad = [&](const std::string& what) {
      return Error(str("load_safetensors: ", path, ": tensor '", name, "': ", what));
    };
    if (name == "__metadata__") {
      // The format says string values; other writers also put true/false/null
      // or numbers there. Those are kept as their JSON text ("true", "null", "3").
      if (!entry.is_object()) throw bad("__metadata__ must be an object");
      for (const auto& [k, v] : entry.items()) out.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    if (!entry.is_object()) throw bad("entry is not an object");
    auto field = [&](const char* key) -> const Json& {
      auto it = entry.find(key);
      if (it == entry.end()) throw bad(str("missing field \"", key, "\""));
      return *it;
    };
    auto as_uint = [&](const Json& v, const char* what) {
      if (!v.is_number_unsigned()) throw bad(str(what, " must be a non-negative integer, got '", v.dump(), "'"));
      return v.get<uint64_t>();
    };

    const Json& dtype_json = field("dtype");
    const std::string dtype_name = dtype_json.is_string() ? dtype_json.get<std::string>() : dtype_json.dump();
    DType dtype = kFloat32;
    if (!dtype_json.is_string() || !dtype_from_safetensors(dtype_name, dtype))
      throw bad("unknown dtype '" + dtype_name + "' (loom reads F64, F32, BF16, F16, I32, I64)");

    const Json& shape_json = field("shape");
    if (!shape_json.is_array()) throw bad("shape must be an array");
    Shape shape;
    uint64_t numel = 1;
    for (const Json& d : shape_json) {
      uint64_t s = as_uint(d, "shape entries");
      if (s != 0 && numel > (uint64_t(1) << 56) / s) throw bad("shape is too large");
      numel *= s;
      shape.push_back(int64_t(s));
    }

    const Json& off = field("data_offsets");
    if (!off.is_array() || off.size() != 2) throw bad("data_offsets must be [begin, end]");
    const uint64_t begin = as_uint(off[0], "data_offsets"), end = as_uint(off[1], "data_offsets");
    const uint64_t nbytes = numel * element_size(dtype);
    if (end < begin || end - begin != nbytes)
      throw bad(str("data_offsets [", begin, ", ", end, "] do not match shape ", shape, " of ", dtype_name, " (",
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
