// Byte-level BPE (the three steps in bpe_tokenizer.h).
#include "data/bpe_tokenizer.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/data.h"
#include "tensor/error.h"

namespace loom::data {

namespace {

using Json = nlohmann::json;

// ---- step 1: GPT-2's word pattern ----------------------------------------------------

enum class Kind { Letter, Number, Space, Other };  // \p{L}, \p{N}, \s, the rest

Kind kind(char32_t c) {
  if (c < 128) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Kind::Letter;
    if (c >= '0' && c <= '9') return Kind::Number;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return Kind::Space;
    return Kind::Other;
  }
  auto in = [c](char32_t a, char32_t b) { return c >= a && c <= b; };
  // Unicode's White_Space beyond ASCII.
  if (c == 0x85 || c == 0xA0 || c == 0x1680 || in(0x2000, 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
      c == 0x205F || c == 0x3000)
    return Kind::Space;
  // Digits and other numbers: Latin-1's superscripts and fractions, Arabic-Indic, Devanagari, super/subscripts,
  // number forms, enclosed numbers, fullwidth digits.
  if (c == 0xB2 || c == 0xB3 || c == 0xB9 || in(0xBC, 0xBE) || in(0x660, 0x669) || in(0x6F0, 0x6F9) ||
      in(0x966, 0x96F) || in(0x2070, 0x2079) || in(0x2080, 0x2089) || in(0x2150, 0x218F) || in(0x2460, 0x249B) ||
      in(0xFF10, 0xFF19))
    return Kind::Number;
  // Punctuation and symbols: Latin-1's (but ª µ º, letters), × ÷, general punctuation, currency, arrows to
  // misc symbols, CJK punctuation, fullwidth punctuation, emoji.
  if ((in(0xA1, 0xBF) && c != 0xAA && c != 0xB5 && c != 0xBA) || c == 0xD7 || c == 0xF7 || in(0x2010, 0x206F) ||
      in(0x20A0, 0x20CF) || in(0x2190, 0x2BFF) || in(0x3001, 0x3004) || in(0x3008, 0x303F) || in(0xFF01, 0xFF0F) ||
      in(0xFF1A, 0xFF20) || in(0x1F000, 0x1FAFF))
    return Kind::Other;
  return Kind::Letter;
}

// ---- step 2: bytes as printable characters (GPT-2's bytes_to_unicode) -----------------

// byte b -> its character: printable Latin-1 bytes stand for themselves, the
// other 68 (controls, space, 0x7F-0xA0, 0xAD) take 256, 257, ... in order.
const std::u32string& byte_chars() {
  static const std::u32string table = [] {
    std::u32string t(256, U'\0');
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[size_t(b)] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

std::string utf8_of(char32_t c) { return encode_utf8(std::u32string(1, c)); }

}  // namespace

std::vector<std::string> BpeTokenizer::pre_tokenize(const std::string& utf8) {
  const std::u32string s = decode_utf8(utf8, "BpeTokenizer::encode");
  const size_t n = s.size();
  std::vector<std::string> words;
  auto push = [&](size_t a, size_t b) { words.push_back(encode_utf8(s.substr(a, b - a))); };
  size_t i = 0;
  while (i < n) {
    if (s[i] == '\'' && i + 1 < n) {  // 's 't 'm 'd 're 've 'll
      const char32_t a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') { push(i, i + 2); i += 2; continue; }
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) { push(i, i + 3); i += 3; continue; }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space, then a run of one kind.
    const size_t j = s[i] == ' ' && i + 1 < n && kind(s[i + 1]) != Kind::Space ? i + 1 : i;
    if (kind(s[j]) != Kind::Space) {
      const Kind k = kind(s[j]);
      size_t e = j;
      while (e < n && kind(s[e]) == k) ++e;
      push(i, e);
      i = e;
      continue;
    }
    // '\s+(?!\S)|\s+': a whitespace run, less its last character when a word follows (that space starts the word).
    size_t e = i;
    while (e < n && kind(s[e]) == Kind::Space) ++e;
    if (e < n && e - i > 1) --e;
    push(i, e);
    i = e;
  }
  return words;
}

BpeTokenizer BpeTokenizer::from_file(const std::string& path) {
  std::ifstream in(path);
  LOOM_CHECK(in, "BpeTokenizer: cannot open ", path);
  std::stringstream text;
  text << in.rdbuf();
  Json j;
  try {
    j = Json::parse(text.str());
  } catch (const Json::exception& e) {  // a parse_error, or out_of_range 406: a number no type holds (found by
    throw Error(str("BpeTokenizer: ", path, ": not valid JSON: ", e.what()));  // fuzz_tokenizer)
  }
  // A stranger's file: any key may hold another type than the format's (a number where an object is),
  // which the JSON library reports by throwing; the message names the file.
  const auto build = [&] {
    LOOM_CHECK(j.contains("model") && j["model"].value("type", "") == "BPE", "BpeTokenizer: ", path,
               ": model.type is not \"BPE\"");
    const Json& pre = j["pre_tokenizer"];
    LOOM_CHECK(pre.is_object() && pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true),
               "BpeTokenizer: ", path, ": pre_tokenizer is not ByteLevel with GPT-2's pattern (got ", pre.dump(), ")");
    LOOM_CHECK(!j.contains("normalizer") || j["normalizer"].is_null(), "BpeTokenizer: ", path,
               ": a normalizer (", j["normalizer"].dump(), ") is not supported");
    BpeTokenizer t;
    t.add_prefix_space_ = pre.value("add_prefix_space", false);
    uint64_t h = 14695981039346656037ull;  // FNV-1a over the file's bytes
    for (const unsigned char c : text.str()) h = (h ^ c) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    t.fingerprint_ = hex;
    const Json& vocab = j["model"]["vocab"];
    t.tokens_.resize(vocab.size());
    for (auto& [token, id] : vocab.items()) {
      // An integer, checked first: nlohmann casts a float id (1e209) with undefined overflow (fuzz_tokenizer).
      LOOM_CHECK(id.is_number_integer(), "BpeTokenizer: ", path, ": token '", token, "' has id ", id.dump(),
                 ", not an integer");
      const int64_t k = id.get<int64_t>();
      LOOM_CHECK(k >= 0 && k < int64_t(vocab.size()) && t.tokens_[size_t(k)].empty(), "BpeTokenizer: ", path,
                 ": token '", token, "' has id ", k, ", not a free id below the vocabulary's ", vocab.size());
      t.tokens_[size_t(k)] = token;
      t.ids_[token] = int32_t(k);
    }
    int rank = 0;
    for (const Json& m : j["model"]["merges"]) {  // "a b" (older files) or ["a", "b"]
      std::pair<std::string, std::string> pair;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        LOOM_CHECK(space != std::string::npos, "BpeTokenizer: ", path, ": merge '", s, "' is not two tokens");
        pair = {s.substr(0, space), s.substr(space + 1)};
      } else {
        pair = {m.at(0).get<std::string>(), m.at(1).get<std::string>()};
      }
      t.merge_rank_.emplace(pair, rank++);
    }
    return t;
  };
  try {
    return build();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("BpeTokenizer: ", path, ": not a tokenizer.json loom reads: ", e.what()));
  }
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& utf8) const {
  std::vector<int32_t> ids;
  const std::string text = add_prefix_space_ && !utf8.starts_with(" ") ? " " + utf8 : utf8;
  for (const std::string& word : pre_tokenize(text)) {
    std::vector<std::string> symbols;  // step 2: one symbol per byte
    for (unsigned char b : word) symbols.push_back(utf8_of(byte_chars()[b]));
    while (symbols.size() > 1) {  // step 3: the best-ranked adjacent pair, merged everywhere in the word
      int best = -1;
      for (size_t k = 0; k + 1 < symbols.size(); ++k)
        if (auto it = merge_rank_.find({symbols[k], symbols[k + 1]}); it != merge_rank_.end())
          if (best < 0 || it->second < best) best = it->second;
      if (best < 0) break;
      std::vector<std::string> merged;
      for (size_t k = 0; k < symbols.size(); ++k) {
        auto it = k + 1 < symbols.size() ? merge_rank_.find({symbols[k], symbols[k + 1]}) : merge_rank_.end();
        if (it != merge_rank_.end() && it->second == best) {
          merged.push_back(symbols[k] + symbols[k + 1]);
          ++k;
        } else {
          merged.push_back(symbols[k]);
        }
      }
      symbols = std::move(merged);
    }
    for (const std::string& sym : symbols) {
      auto it = ids_.find(sym);
      LOOM_CHECK(it != ids_.end(), "BpeTokenizer::encode: the symbol '", sym, "' of the word '", word,
                 "' is not in the vocabulary");
      ids.push_back(it->second);
    }
  }
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  static const std::unordered_map<char32_t, unsigned char> byte_of = [] {
    std::unordered_map<char32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_chars()[size_t(b)]] = static_cast<unsigned char>(b);
    return m;
  }();
  std::string bytes;
  for (int32_t id : ids) {
    LOOM_CHECK(id >= 0 && id < vocab_size(), "BpeTokenizer::decode: id ", id, " out of range for vocabulary of ",
               vocab_size());
    for (char32_t c : decode_utf8(tokens_[size_t(id)], "BpeTokenizer::decode")) {
      auto it = byte_of.find(c);
      LOOM_CHECK(it != byte_of.end(), "BpeTokenizer::decode: token ", id, " holds a character that is no byte");
      bytes.push_back(char(it->second));
    }
  }
  return bytes;
}

}  // namespace loom::data
