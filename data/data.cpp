#include "data/data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "tensor/ops.h"

namespace loom::data {

namespace fs = std::filesystem;

std::u32string decode_utf8(const std::string& s, const std::string& where) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    LOOM_CHECK(len > 0 && i + size_t(len) <= s.size(), where, ": invalid UTF-8 at byte ", i);
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + size_t(k)]);
      LOOM_CHECK((cc >> 6) == 0x2, where, ": invalid UTF-8 at byte ", i + size_t(k));
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Well-formed UTF-8 only (RFC 3629): no overlong forms ("\xC0\x9E" for
    // U+1E would decode but not round-trip through encode_utf8), no UTF-16
    // surrogates, nothing past U+10FFFF.
    static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    LOOM_CHECK(cp >= kMin[len] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF), where, ": invalid UTF-8 at byte ",
               i, " (", cp < kMin[len] ? "overlong encoding" : "not a Unicode scalar value", ")");
    out.push_back(cp);
    i += size_t(len);
  }
  return out;
}

std::string encode_utf8(const std::u32string& text) {
  std::string out;
  for (char32_t cp : text) {
    if (cp < 0x80) {
      out.push_back(char(cp));
    } else if (cp < 0x800) {
      out.push_back(char(0xc0 | (cp >> 6)));
      out.push_back(char(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(char(0xe0 | (cp >> 12)));
      out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(char(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(char(0xf0 | (cp >> 18)));
      out.push_back(char(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(char(0x80 | (cp & 0x3f)));
    }
  }
  return out;
}

CharTokenizer CharTokenizer::from_text(const std::u32string& text) {
  std::set<char32_t> uniq(text.begin(), text.end());
  CharTokenizer t;
  t.chars_.assign(uniq.begin(), uniq.end());
  return t;
}

CharTokenizer CharTokenizer::from_vocab_utf8(const std::string& vocab) {
  CharTokenizer t;
  t.chars_ = decode_utf8(vocab, "vocabulary");
  LOOM_CHECK(std::is_sorted(t.chars_.begin(), t.chars_.end()) &&
                 std::adjacent_find(t.chars_.begin(), t.chars_.end()) == t.chars_.end(),
             "vocabulary: characters must be unique and sorted");
  return t;
}

std::vector<int32_t> CharTokenizer::encode(const std::u32string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    auto it = std::lower_bound(chars_.begin(), chars_.end(), text[i]);
    LOOM_CHECK(it != chars_.end() && *it == text[i], "encode: character U+", std::hex, uint32_t(text[i]),
               " at position ", std::dec, i, " is not in the vocabulary");
    ids[i] = int32_t(it - chars_.begin());
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::u32string s;
  for (int32_t id : ids) {
    LOOM_CHECK(id >= 0 && id < vocab_size(), "decode: id ", id, " out of range for vocabulary of ", vocab_size());
    s.push_back(chars_[size_t(id)]);
  }
  return encode_utf8(s);
}

std::string CharTokenizer::vocab_utf8() const { return encode_utf8(chars_); }

std::string default_corpus_path() { return "/usr/share/games/fortunes"; }

static std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  LOOM_CHECK(in.good(), "corpus: cannot open '", p.string(), "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::u32string read_corpus(const std::string& path, CorpusStats* stats) {
  LOOM_CHECK(fs::exists(path), "corpus: '", path, "' does not exist",
             path == default_corpus_path() ? " (install Debian's fortunes package: apt-get install fortunes)" : "");
  LOOM_CHECK(fs::is_regular_file(path) || fs::is_directory(path), "corpus: '", path,
             "' is not a regular file or a directory (a FIFO or a device would block or never end)");
  std::u32string text;
  if (fs::is_directory(path)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    LOOM_CHECK(!files.empty(), "corpus: no text files in directory '", path, "'");
    for (const auto& f : files) text += decode_utf8(read_file(f), f.string());
  } else {
    text = decode_utf8(read_file(path), path);
  }
  CorpusStats s;
  s.characters = int64_t(text.size());
  std::u32string clean;
  clean.reserve(text.size());
  for (char32_t c : text) {
    if (c >= 0x20 || c == U'\n' || c == U'\t') {
      clean.push_back(c);
    } else {
      ++s.dropped;
      s.nul += c == 0;
    }
  }
  LOOM_CHECK(!text.empty(), "corpus: '", path, "' is empty");
  LOOM_CHECK(!clean.empty(), "corpus: '", path, "' holds ", s.characters, " characters, all of them control "
             "characters (", s.nul, " NUL bytes), which are dropped: no text is left to train on");
  if (stats) *stats = s;
  return clean;
}

std::string dropped_note(const CorpusStats& s) {
  if (s.dropped == 0) return "";
  return str("; ", s.dropped, " control character", s.dropped == 1 ? "" : "s", " dropped",
             s.nul ? str(" (", s.nul, " NUL byte", s.nul == 1 ? "" : "s", ")") : "");
}

TextDataset::TextDataset(std::vector<int32_t> ids, int64_t block_size, double train_fraction) : block_(block_size) {
  LOOM_CHECK(block_size > 0, "dataset: block size must be positive, got ", block_size);
  int64_t n = int64_t(ids.size());
  LOOM_CHECK(n >= block_size + 1, "dataset: corpus has ", n, " tokens, shorter than block_size + 1 = ",
             block_size + 1);
  int64_t n_train = int64_t(double(n) * train_fraction);
  // Each split needs at least one window of block_size + 1 tokens.
  n_train = std::max(n_train, block_size + 1);
  train_.assign(ids.begin(), ids.begin() + n_train);
  if (n - n_train >= block_size + 1) {
    val_.assign(ids.begin() + n_train, ids.end());
  } else {  // a tiny corpus: validate on the training text (val_note says so)
    val_ = train_;
    val_is_train_ = true;
  }
}

std::string TextDataset::val_note() const {
  return val_is_train_ ? " (validation = the training text: the corpus is too short to hold out a tenth)" : "";
}

Batch TextDataset::sample(const std::string& split, int64_t batch, Generator& gen) const {
  LOOM_CHECK(split == "train" || split == "val", "dataset: unknown split '", split, "' (train or val)");
  const std::vector<int32_t>& src = split == "train" ? train_ : val_;
  int64_t T = block_;
  std::vector<int64_t> x(size_t(batch * T)), y(size_t(batch * T));
  for (int64_t b = 0; b < batch; ++b) {
    int64_t start = gen.randint(0, int64_t(src.size()) - T);  // window [start, start + T] inclusive
    for (int64_t t = 0; t < T; ++t) {
      x[size_t(b * T + t)] = src[size_t(start + t)];
      y[size_t(b * T + t)] = src[size_t(start + t + 1)];
    }
  }
  return {from_vector(x, {batch, T}), from_vector(y, {batch, T})};
}

Batch TextDataset::slice(const Batch& b, int64_t begin, int64_t count) {
  return {ops::contiguous(ops::narrow(b.x, 0, begin, count)), ops::contiguous(ops::narrow(b.y, 0, begin, count))};
}

Batch TextDataset::mask_loss_after(const Batch& b, int64_t eod, int64_t ignore_index) {
  Tensor x = ops::contiguous(b.x), y = ops::clone(b.y);  // [B, T] int64 both
  const int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  for (int64_t i = 0; i < x.numel(); ++i)
    if (px[i] == eod) py[i] = ignore_index;
  return {x, y};
}

}  // namespace loom::data
