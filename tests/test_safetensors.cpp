// nn/safetensors: the byte layout, round trips of every dtype, reading a file
// another writer produced, clear errors for broken files, and atomic saves.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include <unistd.h>

#include "error_of.h"
#include "nn/safetensors.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::nn;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom_safetensors_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// 8-byte little-endian length + header + data, assembled by hand.
std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  return out + header + data;
}

using loom::test::error_of;

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

NamedTensors one_of_each_dtype() {
  return {
      {"f64", tensor({1.5, -2.25, 1e-300}, {3}, kFloat64)},
      {"f32", tensor({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32)},
      {"bf16", tensor({0.5, -1, 256}, {3, 1}, kBFloat16)},
      {"f16", tensor({0.25, 65504}, {2}, kFloat16)},
      {"i32", from_vector<int32_t>({-7, 2147483647}, {2})},
      {"i64", from_vector<int64_t>({-1, int64_t(1) << 40, 3}, {1, 3})},
      {"scalar", tensor({42}, {}, kFloat32)},
      {"empty", zeros({0, 3})},
  };
}

}  // namespace

TEST_F(Safetensors, EveryDtypeAndTheMetadataSurviveARoundTrip) {
  NamedTensors saved = one_of_each_dtype();
  std::map<std::string, std::string> meta = {
      {"config", "{\"n_layer\": 2}"}, {"vocab", "a\"b\\c\nd\te\x01 caf\xc3\xa9 \xf0\x9f\x98\x80"}};
  save_safetensors(path("m.safetensors"), saved, meta);
  SafetensorsFile f = load_safetensors(path("m.safetensors"));

  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    const auto& [name, want] = saved[i];
    const Tensor& got = f.tensors[i].second;
    EXPECT_EQ(f.tensors[i].first, name);  // header order = save order
    EXPECT_EQ(got.dtype(), want.dtype()) << name;
    EXPECT_EQ(got.shape(), want.shape()) << name;
    ASSERT_EQ(got.nbytes(), want.nbytes()) << name;
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << name;
  }
  EXPECT_EQ(f.at("i64").to_vector<int64_t>()[1], int64_t(1) << 40);
  EXPECT_FALSE(fs::exists(path("m.safetensors.tmp")));
}

TEST_F(Safetensors, FileIsLengthThenSpacePaddedJsonThenRawLittleEndianData) {
  Tensor a = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<int64_t>({258}, {1});
  save_safetensors(path("x.safetensors"), {{"a", a}, {"b", b}}, {{"k", "v"}});
  std::string bytes = read_bytes(path("x.safetensors"));

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  EXPECT_EQ(n % 8, 0u);                          // data starts 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + n + 6 * 4 + 8);    // header + 24 bytes of F32 + 8 bytes of I64
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_first_not_of(' ', header.rfind('}') + 1), std::string::npos);  // padding is spaces
  EXPECT_HAS(header, "\"__metadata__\":{\"k\":\"v\"}");
  EXPECT_HAS(header, "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}");
  EXPECT_HAS(header, "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]}");

  float first;  // 1.0f little-endian at the start of the data
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(uint8_t(bytes[8 + n + 24]), 2);  // 258 = 0x0102, low byte first
  EXPECT_EQ(uint8_t(bytes[8 + n + 25]), 1);
}

TEST_F(Safetensors, ANonContiguousViewIsWrittenRowMajor) {
  Tensor t = ops::transpose(tensor({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);  // [[1, 4], [2, 5], [3, 6]]
  save_safetensors(path("t.safetensors"), {{"t", t}});
  Tensor got = load_safetensors(path("t.safetensors")).at("t");
  EXPECT_EQ(got.shape(), (Shape{3, 2}));
  EXPECT_EQ(got.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST_F(Safetensors, ReadsAHeaderWrittenByAnotherWriter) {
  // Pretty-printed JSON, data stored in a different order than the header
  // lists it, \u escapes (including a surrogate pair) in the metadata.
  std::string header =
      "{\n  \"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]},\n"
      "  \"ids\": {\"dtype\": \"I32\", \"shape\": [2], \"data_offsets\": [0, 8]},\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"s\": \"\\u00e9\\ud83d\\ude00\\/\"}\n}";
  header.append((8 - header.size() % 8) % 8, ' ');
  int32_t ids[2] = {7, -3};
  float w[2] = {0.5f, -8.0f};
  std::string data(reinterpret_cast<const char*>(ids), 8);
  data.append(reinterpret_cast<const char*>(w), 8);
  write_bytes(path("hf.safetensors"), file_bytes(header, data));

  SafetensorsFile f = load_safetensors(path("hf.safetensors"));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "w");
  EXPECT_EQ(f.at("w").to_vector<float>(), (std::vector<float>{0.5f, -8.0f}));
  EXPECT_EQ(f.at("ids").to_vector<int32_t>(), (std::vector<int32_t>{7, -3}));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("s"), "\xc3\xa9\xf0\x9f\x98\x80/");
  EXPECT_HAS(error_of([&] { f.at("nope"); }), "no tensor named 'nope'");
}

TEST_F(Safetensors, ReadsTrueFalseNullAndNumbersInAHeaderFromAnotherTool) {
  // The format says metadata values are strings, but other writers put JSON
  // literals there (and extra fields beside a tensor's); loom loads them and
  // keeps a non-string metadata value as its JSON text.
  std::string header =
      "{\"__metadata__\": {\"format\": \"pt\", \"sharded\": true, \"quantized\": false, \"note\": null,"
      " \"step\": 3, \"lr\": 0.5},"
      " \"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8], \"requires_grad\": false, \"tag\": null}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  float w[2] = {1.5f, -2.0f};
  write_bytes(path("tool.safetensors"), file_bytes(header, std::string(reinterpret_cast<const char*>(w), 8)));

  SafetensorsFile f = load_safetensors(path("tool.safetensors"));
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.at("w").to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{
                            {"format", "pt"}, {"sharded", "true"}, {"quantized", "false"}, {"note", "null"},
                            {"step", "3"}, {"lr", "0.5"}}));
}

TEST_F(Safetensors, ADuplicatedTensorNameInAHeaderIsRefused) {
  std::string header =
      "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
      " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}";
  write_bytes(path("dup.safetensors"), file_bytes(header, std::string(8, '\0')));
  EXPECT_HAS(error_of([&] { load_safetensors(path("dup.safetensors")); }),
             path("dup.safetensors") + ": tensor 'w': appears twice in the header");
}

// ---- errors ---------------------------------------------------------------------------

TEST_F(Safetensors, MissingFileNamesThePath) {
  std::string msg = error_of([&] { load_safetensors(path("absent.safetensors")); });
  EXPECT_HAS(msg, "cannot open " + path("absent.safetensors"));
  EXPECT_HAS(msg, "No such file");
}

TEST_F(Safetensors, TruncatedFilesNameTheFileAndTheTensor) {
  save_safetensors(path("ok.safetensors"), {{"a", zeros({4})}, {"b", ones({2, 2})}});
  const std::string bytes = read_bytes(path("ok.safetensors"));

  write_bytes(path("short.safetensors"), bytes.substr(0, 5));
  std::string msg = error_of([&] { load_safetensors(path("short.safetensors")); });
  EXPECT_HAS(msg, path("short.safetensors"));
  EXPECT_HAS(msg, "truncated file (5 bytes, less than the 8-byte header length)");

  write_bytes(path("header.safetensors"), bytes.substr(0, 20));
  msg = error_of([&] { load_safetensors(path("header.safetensors")); });
  EXPECT_HAS(msg, path("header.safetensors"));
  EXPECT_HAS(msg, "truncated file (header length");
  EXPECT_HAS(msg, "but only 12 bytes follow it)");

  write_bytes(path("data.safetensors"), bytes.substr(0, bytes.size() - 4));  // loses the end of "b"
  msg = error_of([&] { load_safetensors(path("data.safetensors")); });
  EXPECT_HAS(msg, path("data.safetensors") + ": tensor 'b': truncated file: data [16, 32) lies beyond the 28 bytes");
}

TEST_F(Safetensors, CorruptedHeadersGiveClearErrors) {
  auto load_with_header = [&](const std::string& header, size_t data_bytes = 8) {
    write_bytes(path("bad.safetensors"), file_bytes(header, std::string(data_bytes, '\0')));
    return error_of([&] { load_safetensors(path("bad.safetensors")); });
  };
  std::string msg = load_with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]");
  EXPECT_HAS(msg, path("bad.safetensors") + ": malformed JSON header at byte");
  EXPECT_HAS(msg, "unexpected end of input");

  msg = load_with_header("{\"a\": {\"dtype\": \"F32\" \"shape\": [2]}}");
  EXPECT_HAS(msg, "malformed JSON header at byte 22: expected '}', found '\"'");

  msg = load_with_header("{\"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]}}");
  EXPECT_HAS(msg, path("bad.safetensors") + ": tensor 'a': unknown dtype 'U8'");

  msg = load_with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24);
  EXPECT_HAS(msg, "tensor 'a': data_offsets [0, 20] do not match shape [2, 3] of F32 (24 bytes)");

  msg = load_with_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}");
  EXPECT_HAS(msg, "tensor 'a': shape entries must be a non-negative integer, got '-2'");

  msg = load_with_header("{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}");
  EXPECT_HAS(msg, "tensor 'a': missing field \"shape\"");

  // A number no type holds (nlohmann's out_of_range, not a parse_error; found by fuzz_safetensors).
  msg = load_with_header("{\"a\": 1111111111111111111111111111111111111111e11111111}");
  EXPECT_HAS(msg, path("bad.safetensors") + ": unreadable JSON header");
  EXPECT_HAS(msg, "number overflow");
}

TEST_F(Safetensors, EveryCorruptedHeaderByteLoadsOrFailsWithALoomError) {
  save_safetensors(path("ok.safetensors"), {{"a", zeros({2, 3})}, {"b", ones({4}, kInt64)}}, {{"k", "v\\n"}});
  const std::string good = read_bytes(path("ok.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(good[size_t(i)]);
  int errors = 0, loads = 0;
  for (size_t pos = 8; pos < 8 + n; ++pos)
    for (char c : {'}', '"', '\\', '9'}) {
      std::string bad = good;
      bad[pos] = c;
      write_bytes(path("bad.safetensors"), bad);
      SafetensorsFile f;
      try {
        f = load_safetensors(path("bad.safetensors"));
      } catch (const Error& e) {
        ++errors;
        EXPECT_HAS(std::string(e.what()), path("bad.safetensors"));
        continue;
      }
      // It loaded: the byte landed in a name or a metadata string (or was
      // already c). Then the file still holds the saved tensors, in order, and
      // at most that one string differs from what was saved.
      ++loads;
      SCOPED_TRACE("byte " + std::to_string(pos) + " -> '" + std::string(1, c) + "'");
      ASSERT_EQ(f.tensors.size(), 2u);
      const Tensor& a = f.tensors[0].second;
      const Tensor& b = f.tensors[1].second;
      EXPECT_EQ(a.dtype(), kFloat32);
      EXPECT_EQ(a.shape(), (Shape{2, 3}));
      EXPECT_EQ(a.to_vector<float>(), std::vector<float>(6, 0.f));
      EXPECT_EQ(b.dtype(), kInt64);
      EXPECT_EQ(b.shape(), (Shape{4}));
      EXPECT_EQ(b.to_vector<int64_t>(), std::vector<int64_t>(4, 1));
      ASSERT_EQ(f.metadata.size(), 1u);
      const auto& [key, value] = *f.metadata.begin();
      int changed = (f.tensors[0].first != "a") + (f.tensors[1].first != "b") + (key != "k") + (value != "v\\n");
      EXPECT_LE(changed, 1) << f.tensors[0].first << " " << f.tensors[1].first << " " << key << " " << value;
    }
  EXPECT_GT(errors, 0);
  EXPECT_GT(loads, 0);  // the check above ran
}

// ---- atomic save ----------------------------------------------------------------------

TEST_F(Safetensors, AFailedSaveLeavesTheExistingFileIntact) {
  const std::string target = path("ckpt.safetensors");
  save_safetensors(target, {{"w", tensor({1, 2, 3})}});
  const std::string before = read_bytes(target);

  // The temp file cannot be created (a directory sits at its path): the save
  // fails before touching the target.
  fs::create_directory(target + ".tmp");
  std::string msg = error_of([&] { save_safetensors(target, {{"w", tensor({9, 9, 9, 9})}}); });
  EXPECT_HAS(msg, "cannot open " + target + ".tmp for writing");
  EXPECT_EQ(read_bytes(target), before);
  EXPECT_EQ(load_safetensors(target).at("w").to_vector<float>(), (std::vector<float>{1, 2, 3}));

  // A destination whose directory does not exist.
  msg = error_of([&] { save_safetensors(path("no/such/dir/x.safetensors"), {{"w", tensor({1})}}); });
  EXPECT_HAS(msg, path("no/such/dir/x.safetensors.tmp"));
}

TEST_F(Safetensors, ASuccessfulSaveReplacesTheFileAndLeavesNoTempFile) {
  const std::string target = path("ckpt.safetensors");
  save_safetensors(target, {{"w", tensor({1, 2, 3})}});
  save_safetensors(target, {{"w", tensor({4, 5})}, {"v", tensor({6})}});
  SafetensorsFile f = load_safetensors(target);
  EXPECT_EQ(f.at("w").to_vector<float>(), (std::vector<float>{4, 5}));
  EXPECT_EQ(f.at("v").to_vector<float>(), (std::vector<float>{6}));
  EXPECT_FALSE(fs::exists(target + ".tmp"));
}

TEST_F(Safetensors, SaveRejectsDuplicateAndReservedNames) {
  EXPECT_HAS(error_of([&] { save_safetensors(path("d.safetensors"), {{"w", zeros({1})}, {"w", zeros({1})}}); }),
             "tensor 'w' appears twice");
  EXPECT_HAS(error_of([&] { save_safetensors(path("d.safetensors"), {{"__metadata__", zeros({1})}}); }),
             "invalid tensor name '__metadata__'");
  EXPECT_FALSE(fs::exists(path("d.safetensors")));
}

TEST_F(Safetensors, SaveRefusesBytesThatAreNotUtf8) {
  // JSON text is UTF-8; a header with a stray 0xff would not load in PyTorch either.
  std::string msg = error_of([&] { save_safetensors(path("u.safetensors"), {{"w", zeros({1})}}, {{"k", "a\xff"}}); });
  EXPECT_HAS(msg, path("u.safetensors") + ": a tensor name or metadata entry is not valid UTF-8");
  msg = error_of([&] { save_safetensors(path("u.safetensors"), {{"w\xc3", zeros({1})}}); });
  EXPECT_HAS(msg, "not valid UTF-8");
  EXPECT_FALSE(fs::exists(path("u.safetensors")));
}
