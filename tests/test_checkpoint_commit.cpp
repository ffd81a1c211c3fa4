// Checkpoints are committed as a set (optim/checkpoint_manifest.h): pieces
// under step names, a manifest last. A run killed at any point leaves either
// the previous complete checkpoint or the new one, never a mix; a piece that
// does not match the manifest is refused by name; older steps' pieces and
// leftovers are cleaned.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "nn/safetensors.h"
#include "optim/checkpoint.h"
#include "optim/checkpoint_manifest.h"
#include "run_command.h"

namespace fs = std::filesystem;
using namespace loom;

namespace {

using loom::test::Exec;
using loom::test::run_command;

// A directory of its own, removed when the test ends.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("loom_ckpt_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
    std::ofstream f(path / "corpus.txt");
    for (int i = 0; i < 200; ++i) f << "The quick brown fox " << i << " jumps over the lazy dog.\n";
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string common(const fs::path& d) {
  return " --batch 4 --block 16 --layers 2 --heads 2 --embd 32 --eval-every 0 --sample 0 --warmup 3 --data " +
         (d / "corpus.txt").string() + " ";
}

std::set<std::string> files_in(const fs::path& d) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out.insert(e.path().filename().string());
  return out;
}

// The committed checkpoint at path is whole: every piece the manifest lists
// matches it, and carries its step. Returns that step.
int64_t expect_complete(const fs::path& path) {
  std::string vocab;
  nn::GPTConfig cfg = optim::load_config(path.string(), &vocab);  // reads and verifies the manifest
  EXPECT_EQ(cfg.n_embd, 32);
  nn::SafetensorsFile index = nn::load_safetensors(optim::optimizer_path(path.string()));
  for (const optim::CheckpointPiece& p : optim::decode_pieces(index.metadata.at("pieces"), index.path))
    EXPECT_EQ(nn::load_safetensors((path.parent_path() / p.file).string()).metadata.at("step"),
              index.metadata.at("step"))
        << p.file;
  return optim::parse_int(index.metadata.at("step"), index.path, "step");
}

}  // namespace

TEST(CheckpointCommit, KeepsOnlyTheLastStepsPiecesAndNoTemporaries) {
  TempDir d("set");
  const fs::path ck = d.path / "ck.safetensors";
  Exec r = run_command(std::string(LOOM_TRAIN_GPT) + " --steps 4 --save-every 1 --dtype bf16" + common(d.path) +
                       "--save " + ck.string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(files_in(d.path), (std::set<std::string>{"corpus.txt", "ck.safetensors", "ck.optim.safetensors",
                                                      "ck.step4.model.safetensors", "ck.step4.optim.0.safetensors"}));
  EXPECT_EQ(expect_complete(ck), 4);
  // PATH is the model piece itself (a PyTorch-loadable file with the config).
  EXPECT_EQ(optim::describe_piece(ck.string()).checksum,
            optim::describe_piece((d.path / "ck.step4.model.safetensors").string()).checksum);
}

TEST(CheckpointCommit, APieceFromAnotherRunIsRefusedNamingIt) {
  TempDir d("mix");
  const std::string train = std::string(LOOM_TRAIN_GPT) + " --steps 2" + common(d.path);
  ASSERT_EQ(run_command(train + "--save " + (d.path / "a.safetensors").string() + " 2>&1").status, 0);
  ASSERT_EQ(run_command(train + "--embd 64 --save " + (d.path / "b.safetensors").string() + " 2>&1").status, 0);
  // a's optimizer shard replaced by b's (a 64-wide model's state in a 32-wide checkpoint).
  fs::copy_file(d.path / "b.step2.optim.0.safetensors", d.path / "a.step2.optim.0.safetensors",
                fs::copy_options::overwrite_existing);
  Exec resumed = run_command(train + "--steps 3 --resume " + (d.path / "a.safetensors").string() + " 2>&1");
  EXPECT_EQ(resumed.status, 1);
  EXPECT_NE(resumed.output.find("piece '" + (d.path / "a.step2.optim.0.safetensors").string() + "' is "),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("changed or overwritten after the checkpoint was committed"), std::string::npos)
      << resumed.output;
}

TEST(CheckpointCommit, MetadataIsParsedStrictly) {
  EXPECT_EQ(optim::parse_int("64", "f", "n_embd"), 64);
  for (const char* bad : {"6x", "", " 6", "6 ", "x"}) {
    try {
      optim::parse_int(bad, "ck.safetensors", "n_embd");
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'n_embd' = '" + std::string(bad) + "' is not an integer"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_DOUBLE_EQ(optim::parse_double("0.25", "f", "dropout"), 0.25);
  EXPECT_THROW(optim::parse_double("0.1x", "f", "dropout"), Error);
}

// The kill test: rank 1 of a 2-rank --zero run (each rank writes its own
// shard) is killed with SIGKILL at a random moment while it saves every step;
// after each kill the checkpoint on disk is complete (the previous one or the
// new one), and the next run resumes from it. At the end a resume trains on.
TEST(CheckpointCommit, ARankKilledAtRandomPointsNeverLeavesAMix) {
  TempDir d("kill");
  const fs::path ck = d.path / "ck.safetensors";
  const std::string args = " --dp 2 --zero --batch 2 --steps 100000 --save-every 1 --save " + ck.string() + common(d.path);
  // Rank 1 runs under `timeout -s KILL`; rank 0 dies with the job.
  auto launch = [&](double seconds, bool resume) {
    std::string rank_cmd = "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec timeout -s KILL " +
                           std::to_string(seconds) + " " + LOOM_TRAIN_GPT + args +
                           (resume ? " --resume " + ck.string() : "") + "; else exec " + LOOM_TRAIN_GPT + args +
                           (resume ? " --resume " + ck.string() : "") + "; fi";
    return run_command("timeout -k 5 60 " + std::string(LOOM_MPIEXEC) +
                       " --allow-run-as-root --oversubscribe -np 2 sh -c '" + rank_cmd + "' 2>&1");
  };
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> when(0.3, 1.5);
  int64_t last_step = -1;
  for (int i = 0; i < 6; ++i) {
    // Until a first checkpoint exists, each try waits a second longer (a slow
    // build, such as the sanitizers', takes longer to reach its first save).
    Exec r = launch(when(rng) + (last_step < 0 ? 1.0 + i : 0.0), /*resume=*/last_step >= 0);
    EXPECT_NE(r.status, 0) << "the run was meant to be killed";
    if (!fs::exists(optim::optimizer_path(ck.string()))) continue;  // killed before the first commit
    const int64_t step = expect_complete(ck);
    std::printf("[ measured ] kill %d: the committed checkpoint is whole, at step %lld\n", i, (long long)step);
    EXPECT_GE(step, last_step) << "a resumed run never goes back";
    last_step = step;
  }
  ASSERT_GE(last_step, 1) << "no checkpoint was ever committed; the kills came too early";
  Exec on = run_command("timeout -k 5 60 " + std::string(LOOM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 " +
                        std::string(LOOM_TRAIN_GPT) +
                        " --dp 2 --zero --batch 2 --steps " + std::to_string(last_step + 2) + common(d.path) +
                        "--resume " + ck.string() + " --save " + ck.string() + " 2>&1");
  ASSERT_EQ(on.status, 0) << on.output;
  EXPECT_EQ(expect_complete(ck), last_step + 2);
}
