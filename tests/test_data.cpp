// The text data of train_gpt: tokenizer, corpus reading, splits, batches.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "error_of.h"
#include "data/data.h"

using namespace loom;
using namespace loom::data;

namespace {

std::string write_temp(const std::string& name, const std::string& bytes) {
  auto dir = std::filesystem::temp_directory_path() / "loom_test_data";
  std::filesystem::create_directories(dir);
  auto p = dir / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

using loom::test::error_of;

}  // namespace

TEST(CharTokenizer, VocabularyIsTheSortedSetOfCharacters) {
  CharTokenizer tok = CharTokenizer::from_text(U"hello world");
  EXPECT_EQ(tok.vocab_size(), 8);  // ' ', d, e, h, l, o, r, w
  EXPECT_EQ(tok.vocab_utf8(), " dehlorw");
  EXPECT_EQ(tok.encode(U"hold"), (std::vector<int32_t>{3, 5, 4, 1}));
  EXPECT_EQ(tok.decode({3, 2, 4, 4, 5}), "hello");
}

TEST(CharTokenizer, HandlesMultiByteUtf8AndRoundTripsThroughTheSavedVocabulary) {
  std::u32string text = decode_utf8("na\xC3\xAFve \xE2\x82\xAC", "test");  // "naïve €"
  ASSERT_EQ(text.size(), 7u);
  CharTokenizer tok = CharTokenizer::from_text(text);
  CharTokenizer back = CharTokenizer::from_vocab_utf8(tok.vocab_utf8());
  EXPECT_EQ(back.encode(text), tok.encode(text));
  EXPECT_EQ(back.decode(back.encode(text)), "na\xC3\xAFve \xE2\x82\xAC");
}

TEST(CharTokenizer, UnknownCharacterAndBadIdAreErrors) {
  CharTokenizer tok = CharTokenizer::from_text(U"abc");
  EXPECT_NE(error_of([&] { tok.encode(U"abz"); }).find("U+7a at position 2 is not in the vocabulary"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode({5}); }).find("id 5 out of range for vocabulary of 3"), std::string::npos);
}

TEST(Corpus, InvalidUtf8NamesFileAndByte) {
  std::string p = write_temp("bad.txt", std::string("ok\xFF", 3));
  std::string msg = error_of([&] { read_corpus(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid UTF-8 at byte 2"), std::string::npos) << msg;
}

// Only well-formed UTF-8: what decodes encodes back to the same bytes (the
// fuzzer in fuzz/fuzz_utf8.cpp found the overlong "\xC0\x9E" decoding to U+1E).
TEST(Utf8, OverlongSurrogateAndOutOfRangeSequencesAreErrors) {
  struct Case {
    std::string bytes, why;
  };
  for (const Case& c : {Case{"ab\xC0\x9E", "at byte 2 (overlong encoding)"},
                        Case{"ab\xE0\x80\xAF", "at byte 2 (overlong encoding)"},
                        Case{"ab\xF0\x8F\xBF\xBF", "at byte 2 (overlong encoding)"},
                        Case{"ab\xED\xA0\x80", "at byte 2 (not a Unicode scalar value)"},
                        Case{"ab\xF4\x90\x80\x80", "at byte 2 (not a Unicode scalar value)"}}) {
    std::string msg = error_of([&] { decode_utf8(c.bytes, "t"); });
    EXPECT_NE(msg.find("t: invalid UTF-8 " + c.why), std::string::npos) << msg;
  }
  // The extremes of each length are fine and round-trip.
  const std::string edges =
      "\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";
  std::u32string cps = decode_utf8(edges, "t");
  EXPECT_EQ(cps, (std::u32string{0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF}));
  EXPECT_EQ(encode_utf8(cps), edges);
}

TEST(Corpus, MissingAndEmptyFilesAreClearErrors) {
  EXPECT_NE(error_of([] { read_corpus("/nonexistent/corpus.txt"); }).find("'/nonexistent/corpus.txt' does not exist"),
            std::string::npos);
  std::string p = write_temp("empty.txt", "");
  EXPECT_NE(error_of([&] { read_corpus(p); }).find("is empty"), std::string::npos);
}

TEST(Corpus, DropsControlCharactersButKeepsNewlineAndTab) {
  std::string p = write_temp("ctl.txt", "a\bb\tc\nd\r");
  EXPECT_EQ(read_corpus(p), U"ab\tc\nd");
}

TEST(Corpus, DefaultFortunesDirectoryReadsOnlyPlainTextFiles) {
  // The setup script installs Debian's fortunes package: its absence is a failure, not a skip.
  ASSERT_TRUE(std::filesystem::exists(default_corpus_path())) << "fortunes not installed (apt-get install fortunes)";
  std::u32string text = read_corpus(default_corpus_path());
  // Dozens of files, ~2.5 M characters; no .dat index bytes (they hold NULs / control bytes, dropped or absent).
  EXPECT_GT(text.size(), 1000000u);
  EXPECT_EQ(text.find(U'\0'), std::u32string::npos);
}

TEST(TextDataset, TooShortCorpusIsAnErrorNamingTheSizes) {
  std::string msg = error_of([] { TextDataset(std::vector<int32_t>(8, 0), 8); });
  EXPECT_NE(msg.find("corpus has 8 tokens, shorter than block_size + 1 = 9"), std::string::npos) << msg;
}

TEST(TextDataset, SplitsNinetyTenAndBatchesAreShiftedWindows) {
  std::vector<int32_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[size_t(i)] = i % 97;
  TextDataset ds(ids, 16);
  EXPECT_EQ(ds.train_tokens(), 900);
  EXPECT_EQ(ds.val_tokens(), 100);
  Generator gen(3);
  Batch b = ds.sample("train", 4, gen);
  ASSERT_EQ(b.x.shape(), (Shape{4, 16}));
  std::vector<int64_t> x = b.x.to_vector<int64_t>(), y = b.y.to_vector<int64_t>();
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(y[size_t(r * 16 + t)], (x[size_t(r * 16 + t)] + 1) % 97);  // next token in the sequence
      if (t > 0) {
        EXPECT_EQ(x[size_t(r * 16 + t)], y[size_t(r * 16 + t - 1)]);
      }
    }
}

TEST(TextDataset, SameSeedSameBatchesAndSliceTakesRows) {
  std::vector<int32_t> ids(500);
  for (int i = 0; i < 500; ++i) ids[size_t(i)] = (i * 7) % 31;
  TextDataset ds(ids, 8);
  Generator g1(11), g2(11);
  Batch a = ds.sample("train", 6, g1), b = ds.sample("train", 6, g2);
  EXPECT_EQ(a.x.to_vector<int64_t>(), b.x.to_vector<int64_t>());
  Batch s = TextDataset::slice(a, 2, 3);
  std::vector<int64_t> ax = a.x.to_vector<int64_t>(), sx = s.x.to_vector<int64_t>();
  ASSERT_EQ(sx.size(), 24u);
  EXPECT_EQ(sx, std::vector<int64_t>(ax.begin() + 16, ax.begin() + 40));
}
