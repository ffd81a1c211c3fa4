// The reliability catalog (issue 32) kept as tests: numbers read strictly,
// outputs that never destroy inputs, a checkpoint manifest that verifies
// itself, a clean-up that touches only loom's own files, save names that
// round-trip, a file-size limit and a full disk during a save, ranks built
// differently. Each case is one that once ran silently wrong, lost data or
// died without a word. (The kill -9 loop is test_checkpoint_commit's, also
// under this label.)
// CTest label `reliability` (with `mpi`: some cases launch 2 or 4 ranks).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "error_of.h"
#include "nn/safetensors.h"
#include "optim/checkpoint.h"
#include "optim/checkpoint_manifest.h"
#include "optim/checkpoint_manifest_check.h"
#include "run_command.h"
#include "tensor/numbers.h"
#include "tensor/ops.h"

namespace fs = std::filesystem;
using namespace loom;

namespace {

using loom::test::error_of;
using loom::test::Exec;
using loom::test::run_command;

// A directory of its own with a small corpus, removed when the test ends
// (LOOM_KEEP_WORK_DIRS=1 keeps it).
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("loom_reliability_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
    std::ofstream f(path / "corpus.txt");
    for (int i = 0; i < 200; ++i) f << "The quick brown fox " << i << " jumps over the lazy dog.\n";
  }
  ~TempDir() {
    if (!std::getenv("LOOM_KEEP_WORK_DIRS")) fs::remove_all(path);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

const std::string kSmall = " --batch 4 --block 16 --layers 2 --heads 2 --embd 32 --eval-every 0 --sample 0 --warmup 3 ";

// train_gpt on one process, output and exit code (timeout: a FIFO must not hang the suite).
Exec train(const std::string& args, const std::string& env = "") {
  return run_command("timeout -k 5 120 env " + env + " " + LOOM_TRAIN_GPT + " " + args + " 2>&1");
}

std::string bytes_of(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The committed step of the checkpoint at path, after verifying its manifest and every piece.
int64_t committed_step(const std::string& path) {
  nn::SafetensorsFile m = optim::read_manifest(optim::optimizer_path(path));
  return optim::parse_int(m.metadata.at("step"), m.path, "step");
}

// A refused run: exit 1, the message, and no work begun (the "data:" line comes after every check).
void expect_refused_up_front(const Exec& r, const std::string& message, const std::string& what) {
  EXPECT_EQ(r.status, 1) << what << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << what << "\n" << r.output;
  EXPECT_EQ(r.output.find("data:"), std::string::npos) << what << ": work began before the check\n" << r.output;
}

}  // namespace

// ---- numbers ----------------------------------------------------------------------------

// The one parser: the whole text is the number, in the type's range; nothing is remapped.
TEST(Numbers, TheParserReadsOnlyWholeNumbers) {
  EXPECT_EQ(read_int64("-12"), -12);
  EXPECT_EQ(read_uint64("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(read_double("1e-3"), 1e-3);
  for (const char* bad : {"", " 6", "6 ", "6x", "+6", "0x10", "1e3", "9223372036854775808", "--6"})
    EXPECT_FALSE(read_int64(bad)) << "'" << bad << "'";
  for (const char* bad : {"", "-1", "-0", "18446744073709551616", "1.5"}) EXPECT_FALSE(read_uint64(bad)) << bad;
  for (const char* bad : {"", " 1", "1e400", "1e-400", "0.5x"}) EXPECT_FALSE(read_double(bad)) << bad;
  EXPECT_EQ(error_of([] { parse_number<int>("4097", "--layers", {1, 4096}); }),
            "--layers must be an integer in [1, 4096], got '4097'");
  EXPECT_EQ(error_of([] { parse_number<int>("99999999999", "--dp", {1, 65536}); }),
            "--dp must be an integer in [1, 65536], got '99999999999'");  // not int's wrap-around
  EXPECT_EQ(error_of([] { parse_number<double>("0", "--lr", {0.0, 1e30, "", true}); }),
            "--lr must be a number in (0, 1e+30], got '0'");
}

// Empty values, out-of-range seeds, --bucket-mb 1e30 (an overflowing size
// computation) and a timeout of a nanosecond: refused before any work, in one
// shape naming the flag or variable, the range and the text.
TEST(Numbers, EveryNumericFlagAndVariableIsReadStrictly) {
  TempDir d("numbers");
  const std::string data = " --steps 2" + kSmall + "--data " + (d / "corpus.txt") + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--warmup ''", "--warmup must be an integer in [0, 1099511627776], got ''"},
      {"--steps ''", "--steps must be an integer in [1, 1099511627776], got ''"},
      {"--lr ''", "--lr must be a number in (0, 1e+30], got ''"},
      {"--seed -1", "--seed must be an integer in [0, 18446744073709551615], got '-1'"},
      {"--seed 18446744073709551616",
       "--seed must be an integer in [0, 18446744073709551615], got '18446744073709551616'"},
      {"--bucket-mb 1e30", "--bucket-mb must be a number in (0, 1000000] (1e6 MiB: 977 GiB), got '1e30'"},
      {"--layers 99999999999999999999", "--layers must be an integer in [1, 4096], got '99999999999999999999'"},
      {"--log-every 0", "--log-every must be an integer in [1, 1099511627776], got '0'"},
      {"--eval-every -1", "--eval-every must be an integer in [0, 1099511627776] (0: never), got '-1'"},
      {"--temperature 0", "--temperature must be a number in (0, 1000000], got '0'"},
      {"--lr nan", "--lr must be a number in (0, 1e+30], got 'nan'"},
      {"--threads 2x", "--threads must be an integer in [1, 4096], got '2x'"},
      {"--dropout 1", "--dropout must be a number in [0, 0.99], got '1'"},
  };
  for (const auto& [flags, message] : cases) expect_refused_up_front(train(data + flags), message, flags);
  for (const auto& [value, message] :
       std::vector<std::pair<std::string, std::string>>{
           {"1e-9", "LOOM_COLLECTIVE_TIMEOUT must be a number in [1, 604800] (seconds), got '1e-9'"},
           {"0.1", "LOOM_COLLECTIVE_TIMEOUT must be a number in [1, 604800] (seconds), got '0.1'"},
           {"''", "LOOM_COLLECTIVE_TIMEOUT must be a number in [1, 604800] (seconds), got ''"},
           {"5s", "LOOM_COLLECTIVE_TIMEOUT must be a number in [1, 604800] (seconds), got '5s'"}})
    expect_refused_up_front(train(data, "LOOM_COLLECTIVE_TIMEOUT=" + value), message, "timeout " + value);
  // In range, a flag given twice takes its last value, and runs; the largest
  // seed (past int64's end) round-trips through a checkpoint.
  Exec fine = train(data + "--seed 18446744073709551615 --bucket-mb 0.5 --warmup 5 --warmup 1 --save " +
                        (d / "ck.safetensors"),
                    "LOOM_COLLECTIVE_TIMEOUT=30");
  EXPECT_EQ(fine.status, 0) << fine.output;
  Exec resumed = train(" --steps 3" + kSmall + "--data " + (d / "corpus.txt") + " --resume " + (d / "ck.safetensors"));
  EXPECT_EQ(resumed.status, 0) << resumed.output;
}

// ---- outputs and inputs -----------------------------------------------------------------

// An output over an input or another output is refused before any work, and
// the input is left byte for byte as it was: compared as files (a symlink or
// a hard link to the corpus is the corpus).
TEST(Paths, AnOutputOverAnInputOrAnotherOutputIsRefused) {
  TempDir d("paths");
  const std::string corpus = d / "corpus.txt", before = bytes_of(corpus);
  const std::string data = " --steps 2" + kSmall + "--data " + corpus + " ";
  ASSERT_EQ(train(data + "--save " + (d / "ck.safetensors")).status, 0);
  fs::create_symlink(corpus, d / "link.txt");
  fs::create_hard_link(corpus, d / "hard.txt");
  fs::create_directories(d.path / "texts");
  std::ofstream(d / "texts/a.txt") << std::string(500, 'a') << "\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--log " + corpus, "--log '" + corpus + "' is the same file as --data '" + corpus +
                              "': writing it would destroy the input"},
      {"--log " + d.path.string() + "/./corpus.txt", "is the same file as --data"},
      {"--trace " + (d / "link.txt"), "--trace '" + (d / "link.txt") + "' is the same file as --data"},
      {"--memory-json " + (d / "hard.txt"), "--memory-json '" + (d / "hard.txt") + "' is the same file as --data"},
      {"--save " + corpus, "--save '" + corpus + "' is the same file as --data"},
      {"--log " + (d / "x.json") + " --trace " + (d / "x.json"), "one output would overwrite the other"},
      {"--schedule-svg " + (d / "ck.optim.safetensors") + " --save " + (d / "ck.safetensors"),
       "--save (its manifest) '" + (d / "ck.optim.safetensors") + "' is the same file as --schedule-svg"},
      {"--log " + (d / "ck.safetensors") + " --resume " + (d / "ck.safetensors"),
       "--log '" + (d / "ck.safetensors") + "' is the same file as --resume"},
      {"--log " + (d / "ck.optim.safetensors") + " --resume " + (d / "ck.safetensors"),
       "is the same file as --resume (its manifest)"},
      {"--log " + (d / "ck.step7.model.safetensors") + " --save " + (d / "ck.safetensors"),
       "has the name of a piece of the checkpoint --save"},
      {"--trace " + (d / "ck.step2.optim.0.safetensors") + " --resume " + (d / "ck.safetensors"),
       "--trace '" + (d / "ck.step2.optim.0.safetensors") + "' has the name of a piece of the checkpoint --resume"},
  };
  for (const auto& [flags, message] : cases) expect_refused_up_front(train(data + flags), message, flags);
  // An output inside a --data directory would be read as corpus by the next run.
  expect_refused_up_front(train(" --steps 2" + kSmall + "--data " + (d / "texts") + " --log " +
                                (d / "texts/log.jsonl")),
                          "is inside the --data directory", "--log inside --data");
  EXPECT_EQ(bytes_of(corpus), before) << "the corpus was changed";
  // A model folder (--init-from) and a tokenizer are inputs too; --export-hf's folder is replaced whole.
  ASSERT_EQ(train(data + "--export-hf " + (d / "hf")).status, 0);
  std::ofstream(d / "tok.json") << "{}";
  const std::string init =
      " --steps 2 --batch 4 --eval-every 0 --sample 0 --data " + corpus + " --init-from " + (d / "hf") + " ";
  const std::string config = bytes_of(d / "hf/config.json"), weights = bytes_of(d / "hf/model.safetensors");
  expect_refused_up_front(train(init + "--log " + (d / "hf/config.json")),
                          "is the same file as --init-from (its config.json)", "--log over --init-from's config");
  expect_refused_up_front(train(init + "--save " + (d / "hf/model.safetensors")),
                          "is the same file as --init-from (its model.safetensors)",
                          "--save over --init-from's weights");
  expect_refused_up_front(train(data + "--tokenizer " + (d / "tok.json") + " --log " + (d / "tok.json")),
                          "is the same file as --tokenizer", "--log over --tokenizer");
  expect_refused_up_front(train(data + "--export-hf " + (d / "hf") + " --log " + (d / "hf/log.jsonl")),
                          "is inside the --export-hf folder", "--log inside --export-hf");
  EXPECT_EQ(bytes_of(d / "hf/config.json"), config) << "--init-from's config.json was changed";
  EXPECT_EQ(bytes_of(d / "hf/model.safetensors"), weights) << "--init-from's weights were changed";
  // --save over --resume is the ordinary way to train on: allowed.
  Exec on = train(" --steps 3" + kSmall + "--data " + corpus + " --resume " + (d / "ck.safetensors") + " --save " +
                  (d / "ck.safetensors"));
  ASSERT_EQ(on.status, 0) << on.output;
  EXPECT_EQ(committed_step(d / "ck.safetensors"), 3);
}

// --data is a regular file or a directory: a FIFO (which blocked forever) and
// /dev/zero (read until std::bad_alloc) are refused naming what they are; a
// file of NUL bytes is reported as such, not as "empty"; dropped control
// characters are counted; a corpus too short to hold out a tenth says that
// validation is the training text.
TEST(Paths, DataIsARegularFileAndWhatIsDroppedIsSaid) {
  TempDir d("data");
  const std::string run = " --steps 1" + kSmall + "--data ";
  ASSERT_EQ(mkfifo((d / "fifo").c_str(), 0600), 0);
  expect_refused_up_front(train(run + (d / "fifo")), "--data '" + (d / "fifo") + "' is a FIFO (named pipe)", "FIFO");
  expect_refused_up_front(train(run + "/dev/zero"), "--data '/dev/zero' is a character device", "/dev/zero");
  std::ofstream(d / "nul.txt") << std::string(4096, '\0');
  Exec nul = train(run + (d / "nul.txt"));
  EXPECT_EQ(nul.status, 1) << nul.output;
  EXPECT_NE(nul.output.find("holds 4096 characters, all of them control characters (4096 NUL bytes)"),
            std::string::npos) << nul.output;
  {
    std::ofstream f(d / "ctl.txt");
    for (int i = 0; i < 200; ++i) f << "The quick\b brown fox " << i << "\r\n";
  }
  Exec ctl = train(run + (d / "ctl.txt"));
  ASSERT_EQ(ctl.status, 0) << ctl.output;
  EXPECT_NE(ctl.output.find("; 400 control characters dropped\n"), std::string::npos) << ctl.output;
  // 40 tokens: training takes 36 (90%), and the other 4 are fewer than a block of 16 + 1.
  std::ofstream(d / "tiny.txt") << "The quick brown fox jumps over the dogs.";
  Exec tiny = train(run + (d / "tiny.txt"));
  ASSERT_EQ(tiny.status, 0) << tiny.output;
  EXPECT_NE(tiny.output.find("36 train / 36 val tokens (validation = the training text: the corpus is too short "
                             "to hold out a tenth)"),
            std::string::npos)
      << tiny.output;
  EXPECT_EQ(train(run + (d / "corpus.txt")).output.find("validation = the training text"), std::string::npos);
}

// ---- the checkpoint commit record -------------------------------------------------------

namespace {

// The manifest of d/ck.safetensors, changed by `edit` and written back; with
// reseal, under a fresh checksum (how a consistent edit reaches the checks
// behind the checksum).
void edit_manifest(const TempDir& d, const std::function<void(nn::SafetensorsFile&)>& edit, bool reseal) {
  const std::string index = optim::optimizer_path(d / "ck.safetensors");
  nn::SafetensorsFile m = nn::load_safetensors(index);
  edit(m);
  if (reseal) m.metadata["checksum"] = optim::manifest_checksum(m.tensors, m.metadata);
  nn::save_safetensors(index, m.tensors, m.metadata);
}

}  // namespace

// The manifest verifies itself: its checksum covers every field, and every
// field is checked against the others; a piece is a plain name beside it.
TEST(Manifest, AnEditedManifestIsRefusedNamingWhatDisagrees) {
  TempDir d("manifest");
  const std::string ck = d / "ck.safetensors", index = optim::optimizer_path(ck);
  const std::string data = kSmall + "--data " + (d / "corpus.txt") + " ";
  ASSERT_EQ(train(" --steps 2" + data + "--save " + ck).status, 0);
  const std::string committed = bytes_of(index);
  auto with_step = [](const std::string& s) {
    return [s](nn::SafetensorsFile& m) { m.metadata["step"] = s; };
  };
  struct Case {
    std::string what;
    std::function<void(nn::SafetensorsFile&)> edit;
    bool reseal;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"step edited", with_step("1"), false, "its content has checksum "},
      {"a byte of the data generator's state", [](nn::SafetensorsFile& m) {
         for (auto& [name, t] : m.tensors)
           if (name == "train.data_rng") static_cast<unsigned char*>(t.raw_data())[3] ^= 0x10;
       }, false, "it was edited or damaged after the checkpoint was committed"},
      {"step edited and resealed", with_step("1"), true, "the metadata says step 1 but train.step is 2"},
      {"a shard dropped from pieces", [](nn::SafetensorsFile& m) {
         std::vector<optim::CheckpointPiece> p = optim::decode_pieces(m.metadata["pieces"], m.path);
         p.pop_back();
         m.metadata["pieces"] = optim::encode_pieces(p);
       }, true, "' is named as a shard but not listed in 'pieces' (so never verified)"},
      {"a piece outside the folder", [](nn::SafetensorsFile& m) {
         std::vector<optim::CheckpointPiece> p = optim::decode_pieces(m.metadata["pieces"], m.path);
         p.push_back({"../corpus.txt", 10, "0"});
         m.metadata["pieces"] = optim::encode_pieces(p);
       }, true, "piece '../corpus.txt' is not a plain file name"},
      {"the model not a piece", [](nn::SafetensorsFile& m) { m.metadata["model"] = "corpus.txt"; }, true,
       "'corpus.txt' is named as the model but not listed in 'pieces'"},
  };
  for (const Case& c : cases) {
    std::ofstream(index, std::ios::binary) << committed;
    edit_manifest(d, c.edit, c.reseal);
    Exec r = train(" --steps 3" + data + "--resume " + ck);
    EXPECT_EQ(r.status, 1) << c.what << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.what << "\n" << r.output;
  }
  std::ofstream(index, std::ios::binary) << committed;  // as committed: resumes
  Exec r = train(" --steps 3" + data + "--resume " + ck);
  EXPECT_EQ(r.status, 0) << r.output;
}

// The mutation audit's first hole: a piece of the same size with one byte
// flipped (the checksum, not only the size, must be compared).
TEST(Manifest, APieceWithOneByteFlippedIsRefused) {
  TempDir d("flip");
  const std::string ck = d / "ck.safetensors";
  const std::string data = kSmall + "--data " + (d / "corpus.txt") + " ";
  ASSERT_EQ(train(" --steps 2" + data + "--save " + ck).status, 0);
  for (const std::string piece : {"ck.step2.optim.0.safetensors", "ck.step2.model.safetensors"}) {
    std::string bytes = bytes_of(d / piece);
    const std::string original = bytes;
    bytes[bytes.size() - 5] ^= 0x01;  // a bit of the last tensor's data
    std::ofstream(d / piece, std::ios::binary) << bytes;
    ASSERT_EQ(fs::file_size(d / piece), original.size());
    Exec r = train(" --steps 3" + data + "--resume " + ck);
    EXPECT_EQ(r.status, 1) << piece << "\n" << r.output;
    EXPECT_NE(r.output.find("piece '" + (d / piece) + "' is " + std::to_string(original.size()) +
                            " bytes with checksum "),
              std::string::npos) << r.output;
    std::ofstream(d / piece, std::ios::binary) << original;
  }
}

// The clean-up after a commit removes only loom's own piece names and their
// temporaries; a user's files that share the stem stay.
TEST(Manifest, CleanUpRemovesOnlyLoomsOwnPieces) {
  TempDir d("cleanup");
  const std::string ck = d / "ck.safetensors";
  const std::set<std::string> users = {"ck.notes.tmp", "ck.step1.txt", "ck.step1.model.safetensors.bak",
                                       "ck.stepX.model.safetensors", "ck.safetensors.orig",
                                       "ck.step1.optim.x.safetensors", "ck.step1.tmp",
                                       // numbers loom never writes (it writes step1 and optim.0)
                                       "ck.step01.model.safetensors", "ck.step1.optim.00.safetensors"};
  for (const std::string& f : users) std::ofstream(d / f) << "mine";
  // Loom's own leftovers: an older step's shard, an interrupted save's temporaries.
  const std::set<std::string> stale = {"ck.step1.optim.7.safetensors", "ck.step2.model.safetensors.tmp",
                                       "ck.safetensors.tmp", "ck.optim.safetensors.tmp"};
  for (const std::string& f : stale) std::ofstream(d / f) << "stale";
  Exec r = train(" --steps 3 --save-every 1" + kSmall + "--data " + (d / "corpus.txt") + " --save " + ck);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const std::string& f : users) {
    EXPECT_TRUE(fs::exists(d.path / f)) << f << " was removed";
    EXPECT_EQ(bytes_of(d / f), "mine") << f;
  }
  for (const std::string& f : stale) EXPECT_FALSE(fs::exists(d.path / f)) << f << " was left";
  EXPECT_FALSE(fs::exists(d.path / "ck.step2.model.safetensors"));
  EXPECT_EQ(committed_step(ck), 3);
}

// --export-hf DIR writes beside DIR in folders of its own: a user's DIR.tmp and
// DIR.old (names it once used, and removed) are left as they are, a second
// export replaces the first, and no scratch folder is left behind.
TEST(Paths, ExportLeavesTheUsersFoldersBesideItAlone) {
  TempDir d("export_beside");
  for (const char* mine : {"out.tmp", "out.old"}) {
    fs::create_directories(d.path / mine);
    std::ofstream(d.path / mine / "notes.txt") << "mine";
  }
  for (int run = 0; run < 2; ++run) {
    Exec r = train(" --steps 2" + kSmall + "--data " + (d / "corpus.txt") + " --export-hf " + (d / "out"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(fs::exists(d.path / "out" / "config.json")) << "run " << run;
    EXPECT_TRUE(fs::exists(d.path / "out" / "model.safetensors")) << "run " << run;
  }
  for (const char* mine : {"out.tmp", "out.old"}) EXPECT_EQ(bytes_of(d / (std::string(mine) + "/notes.txt")), "mine");
  // The folder has a new folder's permissions (not the scratch folder's 0700), so others may read it.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(int(fs::status(d.path / "out").permissions()) & 0777, int(0777 & ~mask));
  for (const auto& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename().string().find("out.loom-"), std::string::npos) << e.path() << " was left behind";
}

// A name whose pieces cannot round-trip through the manifest (its separators)
// or the file system (too long with a piece's suffix) is refused before training.
TEST(Manifest, ASaveNameThatCannotRoundTripIsRefusedBeforeTraining) {
  TempDir d("names");
  const std::string data = " --steps 2" + kSmall + "--data " + (d / "corpus.txt") + " --save ";
  for (const char* name : {"a;b.safetensors", "a:b.safetensors", "a,b.safetensors"})
    expect_refused_up_front(train(data + "'" + (d / name) + "'"), "which the manifest uses to separate its pieces",
                            name);
  // 230 characters fit alone, not with ".step2.optim.0.safetensors.tmp".
  const std::string long_name = std::string(230, 'n') + ".safetensors";
  expect_refused_up_front(train(data + (d / long_name)), "its pieces' names would be too long for the file system",
                          "a long name");
  Exec fine = train(data + (d / (std::string(200, 'n') + ".safetensors")));
  EXPECT_EQ(fine.status, 0) << fine.output;
}

// Resuming a step-4 checkpoint with --stop-at 2 --save over it would write
// "step 2" over step-4 weights: refused before training, the checkpoint kept.
TEST(Manifest, ASaveNeverLabelsStateWithAnotherStep) {
  TempDir d("label");
  const std::string ck = d / "ck.safetensors";
  const std::string data = kSmall + "--data " + (d / "corpus.txt") + " ";
  ASSERT_EQ(train(" --steps 4" + data + "--save " + ck).status, 0);
  const std::string model = bytes_of(d / "ck.step4.model.safetensors");
  Exec r = train(" --steps 8 --stop-at 2" + data + "--resume " + ck + " --save " + ck);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--stop-at 2 is below the step of the checkpoint --resume " + ck + " (4 steps done)"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(" | loss "), std::string::npos) << "it trained\n" << r.output;
  EXPECT_EQ(committed_step(ck), 4);
  EXPECT_EQ(bytes_of(d / "ck.step4.model.safetensors"), model);
}

// ---- faults -----------------------------------------------------------------------------

// A file-size limit (ulimit -f) during a save: no SIGXFSZ death without a
// word, but the save's error ("File too large"), exit 1, and the previous
// checkpoint whole; a resume from it trains on. Looped over limits that cut
// the optimizer shard at different bytes (the disk-full loop, bounded).
TEST(Faults, AFileSizeLimitDuringASaveIsAnErrorAndThePreviousCheckpointStays) {
  TempDir d("fsize");
  const std::string ck = d / "ck.safetensors";
  const std::string data = kSmall + "--data " + (d / "corpus.txt") + " ";
  ASSERT_EQ(train(" --steps 2" + data + "--save " + ck).status, 0);
  const uintmax_t shard = fs::file_size(d.path / "ck.step2.optim.0.safetensors");
  // ulimit -f counts 512-byte blocks: 1 block, half the shard, one block short of it.
  // (PMIX_MCA_gds=hash: Open MPI's start-up keeps its key-value store in
  // memory, not in a shared-memory file of ~4 MB that the limit would refuse.)
  for (uintmax_t blocks : {uintmax_t(1), shard / 1024, shard / 512 - 1}) {
    const std::string cmd = "ulimit -f " + std::to_string(blocks) + " && PMIX_MCA_gds=hash exec " + LOOM_TRAIN_GPT +
                            " --steps 4" + data + "--resume " + ck + " --save " + ck;
    Exec r = run_command("timeout -k 5 120 sh -c '" + cmd + "' 2>&1");
    EXPECT_EQ(r.status, 1) << blocks << " blocks: not the save's error path\n" << r.output;
    EXPECT_NE(r.output.find("File too large"), std::string::npos) << blocks << " blocks\n" << r.output;
    EXPECT_NE(r.output.find("is unchanged"), std::string::npos) << r.output;
    EXPECT_EQ(committed_step(ck), 2) << blocks << " blocks";
  }
  Exec on = train(" --steps 4" + data + "--resume " + ck + " --save " + ck);
  ASSERT_EQ(on.status, 0) << on.output;
  EXPECT_EQ(committed_step(ck), 4);
}

// The same limit on --log and --export-hf: their writer's error naming the file
// and "File too large", exit 1, no SIGXFSZ death (status 153 from the shell),
// and no export scratch folder left beside the (absent) DIR.
TEST(Faults, AFileSizeLimitOnTheLogOrTheExportIsAnErrorNamingIt) {
  TempDir d("fsize_log");
  const std::string data = kSmall + "--data " + (d / "corpus.txt") + " --steps 6 --log-every 1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--log " + (d / "log.jsonl"), "--log: cannot write '" + (d / "log.jsonl") + "'"},
      {"--export-hf " + (d / "out"), "out.loom-export-"}};
  for (const auto& [flags, names] : cases) {
    const std::string cmd = "ulimit -f 1 && PMIX_MCA_gds=hash exec " + std::string(LOOM_TRAIN_GPT) + data + flags;
    Exec r = run_command("timeout -k 5 120 sh -c '" + cmd + "' 2>&1");
    EXPECT_EQ(r.status, 1) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find("File too large"), std::string::npos) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(names), std::string::npos) << flags << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(d.path / "out"));
  for (const auto& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename().string().find("out.loom-"), std::string::npos) << e.path() << " was left behind";
}

// The losses of a JSON-lines log, as printed (%.17g: equal text, equal bits).
std::vector<std::string> logged_losses(const std::string& log) {
  std::vector<std::string> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    const size_t k = line.find("\"loss\": ");
    if (k != std::string::npos) out.push_back(line.substr(k + 8, line.find(',', k) - k - 8));
  }
  return out;
}

// The disk-full loop: a run saving every step into a small tmpfs (its own
// mount namespace, gone when the run is) fills it during a save - at the
// optimizer shard or at the model piece, by the size - and stops with the
// save's error ("No space left on device"); the checkpoint committed before is
// whole, and a run resumed from it gives the straight run's losses bit for bit.
TEST(Faults, ADiskFullDuringASaveLeavesThePreviousCheckpointToResumeFrom) {
  TempDir d("disk_full");
  const Exec probe = run_command("unshare -m true 2>&1");
  if (probe.status != 0)
    GTEST_SKIP() << "no mount namespace for a small tmpfs (unshare -m: " << probe.output << "); it needs root";
  const std::string data = kSmall + "--data " + (d / "corpus.txt") + " ";
  ASSERT_EQ(train(" --steps 3" + data + "--log " + (d / "straight.jsonl")).status, 0);
  const std::vector<std::string> straight = logged_losses(d / "straight.jsonl");
  ASSERT_EQ(straight.size(), 3u);
  // One checkpoint is ~450 KB (a 338 KB shard, a 112 KB model); a commit holds two for a moment.
  for (const char* size : {"480k", "640k", "860k"}) {
    const std::string mnt = d / (std::string("tmpfs_") + size), copy = d / (std::string("copy_") + size);
    fs::create_directories(mnt);
    fs::create_directories(copy);
    const std::string script = "mount -t tmpfs -o size=" + std::string(size) + " tmpfs " + mnt + " && " +
                               LOOM_TRAIN_GPT + " --steps 100 --save-every 1" + data + "--save " + mnt +
                               "/ck.safetensors; echo exit=$?; cp -a " + mnt + "/. " + copy;
    Exec r = run_command("timeout -k 5 120 unshare -m sh -c '" + script + "' 2>&1");
    EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << size << "\n" << r.output;
    EXPECT_NE(r.output.find("exit=1"), std::string::npos) << size << "\n" << r.output;
    const int64_t step = committed_step(copy + "/ck.safetensors");
    std::printf("[ measured ] tmpfs %s: full at the save of step %lld\n", size, (long long)step + 1);
    ASSERT_GE(step, 1) << size;
    ASSERT_LT(step, 3) << size << ": the disk never filled";
    Exec on = train(" --steps 3" + data + "--resume " + copy + "/ck.safetensors --log " + copy + "/resumed.jsonl");
    ASSERT_EQ(on.status, 0) << size << "\n" << on.output;
    const std::vector<std::string> resumed = logged_losses(copy + "/resumed.jsonl");
    EXPECT_EQ(resumed, std::vector<std::string>(straight.begin() + step, straight.end())) << size;
  }
}

// Ranks built differently (a release and a sanitizer build) stop at the
// start-up handshake, before any collective of the run, naming what differs.
// The difference is faked with LOOM_TEST_BUILD_NOTE on rank 1.
TEST(Faults, RanksBuiltDifferentlyAreStoppedByTheHandshake) {
  TempDir d("build");
  const std::string args = " --dp 2 --steps 2" + kSmall + "--data " + (d / "corpus.txt");
  const std::string rank_cmd = "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then export LOOM_TEST_BUILD_NOTE=asan; fi; "
                               "exec " + std::string(LOOM_TRAIN_GPT) + args;
  Exec r = run_command("timeout -k 5 60 env LOOM_COLLECTIVE_TIMEOUT=30 " + std::string(LOOM_MPIEXEC) +
                       " --allow-run-as-root --oversubscribe -np 2 sh -c '" + rank_cmd + "' 2>&1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ranks disagree on the build (group world, size 2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("test build note: (missing) on rank 0; 'asan' on rank 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("data:"), std::string::npos) << r.output;
  // The same on both ranks: the handshake passes, and the run trains.
  Exec same = run_command("timeout -k 5 60 env LOOM_COLLECTIVE_TIMEOUT=30 LOOM_TEST_BUILD_NOTE=asan " +
                          std::string(LOOM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 " + LOOM_TRAIN_GPT +
                          args + " 2>&1");
  EXPECT_EQ(same.status, 0) << same.output;
}

// ---- the mutation audit's second hole: a tp 4 checkpoint --------------------------------

namespace {

// Every (kind, param) of a checkpoint's optimizer state, joined from its shards.
std::map<std::string, Tensor> optimizer_state(const std::string& ck) {
  nn::SafetensorsFile index = optim::read_manifest(optim::optimizer_path(ck));
  std::map<std::string, Tensor> out;
  std::stringstream list(index.metadata.at("shards"));
  for (std::string file; std::getline(list, file, ',');)
    for (auto& [key, t] : nn::load_safetensors((fs::path(ck).parent_path() / file).string()).tensors) out[key] = t;
  return out;
}

// ||a - b|| / ||b|| over every tensor of both, the worst one. Within 1e-3:
// the runs differ in rounding only (a tp rank sums a matmul's partial products
// in another order), which AdamW amplifies where a gradient is ~0 - the
// attention key bias's, whose true gradient is exactly 0 (tests/train_gpt_run.h):
// measured worst 1.0e-4, on blocks.0.attn.c_attn.bias. A replicated param
// saved from every tp rank instead of one would be off by 3 (4x the state).
double worst_relative_difference(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [key, tb] : b) {
    auto it = a.find(key);
    EXPECT_NE(it, a.end()) << key;
    if (it == a.end()) continue;
    std::vector<double> x = ops::to(it->second, kFloat64).to_vector<double>();
    std::vector<double> y = ops::to(tb, kFloat64).to_vector<double>();
    EXPECT_EQ(x.size(), y.size()) << key;
    double diff = 0, ref = 0;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) diff += (x[i] - y[i]) * (x[i] - y[i]), ref += y[i] * y[i];
    const double rel = std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
    EXPECT_LE(rel, 1e-3) << key;
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace

// Saved at tp 4 (each of 4 ranks holds one head; the replicated params -
// layernorms, biases of row-parallel layers - written once, by tp rank 0) and
// reloaded at tp 4, the optimizer state equals the one-process run's. Writing
// a replicated param from every tp rank would sum it 4 times over.
TEST(TensorParallel, AFourRankCheckpointHoldsTheUnshardedOptimizerState) {
  TempDir d("tp4");
  const std::string common = " --heads 4 --batch 4 --block 16 --layers 2 --embd 32 --eval-every 0 --sample 0 "
                             "--warmup 3 --data " + (d / "corpus.txt");
  auto run = [&](int ranks, const std::string& args) {
    const std::string mpi = std::string(LOOM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np ";
    const std::string launch = ranks == 1 ? "" : mpi + std::to_string(ranks) + " ";
    return run_command("timeout -k 5 120 env LOOM_COLLECTIVE_TIMEOUT=60 " + launch + LOOM_TRAIN_GPT + common + args +
                       " 2>&1");
  };
  Exec one = run(1, " --steps 4 --stop-at 2 --save " + (d / "one.safetensors"));
  ASSERT_EQ(one.status, 0) << one.output;
  Exec four = run(4, " --tp 4 --steps 4 --stop-at 2 --save " + (d / "tp4.safetensors"));
  ASSERT_EQ(four.status, 0) << four.output;
  const double saved = worst_relative_difference(optimizer_state(d / "tp4.safetensors"),
                                                 optimizer_state(d / "one.safetensors"));
  // Reloaded at tp 4 and trained on: still the one-process run's state.
  ASSERT_EQ(run(1, " --steps 4 --resume " + (d / "one.safetensors") + " --save " + (d / "one.safetensors")).status, 0);
  Exec again = run(4, " --tp 4 --steps 4 --resume " + (d / "tp4.safetensors") + " --save " + (d / "tp4.safetensors"));
  ASSERT_EQ(again.status, 0) << again.output;
  const double reloaded = worst_relative_difference(optimizer_state(d / "tp4.safetensors"),
                                                    optimizer_state(d / "one.safetensors"));
  std::printf("[ measured ] tp 4 vs one process, optimizer state ||diff|| / ||ref||: saved %.2e, reloaded %.2e\n",
              saved, reloaded);
}

// ---- typos ------------------------------------------------------------------------------

// No doubled word ("the the") in the sources' messages and comments, and
// none composed at run time: check_ranks_agree says "ranks disagree on the " +
// what, so no `what` may begin with "the" (or be a clause: "on the whether").
TEST(Typos, NoDoubledWordsInTheSources) {
  const fs::path root = fs::path(LOOM_TEST_DATA_DIR).parent_path();
  std::vector<std::string> found;
  for (const char* dir : {"tensor", "autograd", "nn", "parallel", "optim", "data", "examples", "plan"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu") continue;
      const std::string text = bytes_of(e.path().string());
      for (const char* twice : {" the the ", " a a ", " to to ", " of of ", " is is ", " on the whether"})
        if (text.find(twice) != std::string::npos) found.push_back(e.path().string() + ": '" + twice + "'");
      // Each call's arguments up to its ';': a string literal that starts "the " or "whether" is a `what`.
      for (size_t at = text.find("check_ranks_agree("); at != std::string::npos;
           at = text.find("check_ranks_agree(", at + 1)) {
        const std::string call = text.substr(at, text.find(';', at) - at);
        for (const char* opening : {"\"the ", "\"whether "})
          if (call.find(opening) != std::string::npos) found.push_back(e.path().string() + ": " + call);
      }
    }
  }
  EXPECT_TRUE(found.empty()) << found.size() << " doubled words, first in " << (found.empty() ? "" : found[0]);
}
