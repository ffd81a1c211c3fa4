#include "train/paths.h"

#include <sys/stat.h>

#include <csignal>
#include <filesystem>
#include <vector>

#include "optim/checkpoint.h"
#include "optim/checkpoint_manifest.h"
#include "tensor/error.h"

namespace loom::train {

namespace {

namespace fs = std::filesystem;

// One file the run reads or writes, and the flag it comes from.
struct RunFile {
  std::string flag;  // "--log", or "--save (its manifest)"
  fs::path path;
  bool output;
  int group;  // the files of one flag (--save and its manifest) are not compared with each other
};

// The same file: the same canonical path (symlinks and "a/../b" resolved), or
// the same inode (a hard link).
bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec1, ec2;
  if (fs::weakly_canonical(a, ec1) == fs::weakly_canonical(b, ec2) && !ec1 && !ec2) return true;
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

// What a path that is not a regular file is, for the message.
std::string kind_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "unreadable";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

// --data: a regular file or a directory (read_corpus reads its regular files).
// A FIFO would block the run forever, /dev/zero would be read until memory runs out.
void check_data(const std::string& data) {
  LOOM_CHECK(fs::exists(data), "--data '", data, "' does not exist",
             data == data::default_corpus_path() ? " (install Debian's fortunes package: apt-get install fortunes)"
                                                 : "");
  LOOM_CHECK(fs::is_regular_file(data) || fs::is_directory(data), "--data '", data, "' is ", kind_of(data),
             "; give a text file or a directory of them");
}

// The checkpoint stem of a --save or --resume path: "out/gpt.safetensors" -> "gpt".
std::string stem_of(const std::string& checkpoint) {
  std::string name = fs::path(checkpoint).filename().string();
  if (name.ends_with(".safetensors") && name.size() > 12) name.resize(name.size() - 12);
  return name;
}

bool inside(const fs::path& file, const fs::path& dir) {
  std::error_code ec;
  const fs::path f = fs::weakly_canonical(file, ec), d = fs::weakly_canonical(dir, ec);
  auto [end, _] = std::mismatch(d.begin(), d.end(), f.begin(), f.end());
  return end == d.end();
}

// Every file of the run, grouped by the flag it comes from.
std::vector<RunFile> run_files(const Args& a) {
  std::vector<RunFile> files;
  int group = 0;
  files.push_back({"--data", a.data, false, group++});
  if (!a.resume.empty()) {
    files.push_back({"--resume", a.resume, false, group});
    files.push_back({"--resume (its manifest)", optim::optimizer_path(a.resume), false, group++});
  }
  if (!a.save.empty()) {
    files.push_back({"--save", a.save, true, group});
    files.push_back({"--save (its manifest)", optim::optimizer_path(a.save), true, group});
    files.push_back({"--save (its temporary)", a.save + ".tmp", true, group++});
  }
  // --init-from's folder and --tokenizer are read: no output may land on them.
  if (!a.init_from.empty()) {
    for (const char* f : {"config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json"})
      files.push_back({"--init-from (its " + std::string(f) + ")", fs::path(a.init_from) / f, false, group});
    ++group;
  }
  if (!a.tokenizer.empty()) files.push_back({"--tokenizer", a.tokenizer, false, group++});
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--log", a.log},
                                   {"--trace", a.trace},
                                   {"--memory-json", a.memory_json},
                                   {"--schedule-svg", a.schedule_svg}})
    if (!path.empty()) files.push_back({flag, path, true, group++});
  return files;
}

// No file of the run may have the name of a piece of `checkpoint`: --save's
// are written and later removed by each commit (so no input or output), and
// --resume's hold its state (so no output).
void check_piece_names(const std::vector<RunFile>& files, const std::string& flag, const std::string& checkpoint,
                       bool outputs_only) {
  if (checkpoint.empty()) return;
  const fs::path dir = fs::path(checkpoint).parent_path();
  for (const RunFile& f : files) {
    if (f.flag.starts_with(flag) || (outputs_only && !f.output)) continue;
    const bool beside = same_file(f.path.parent_path().empty() ? "." : f.path.parent_path(), dir.empty() ? "." : dir);
    LOOM_CHECK(!beside || !optim::is_piece_name(f.path.filename().string(), stem_of(checkpoint)), f.flag, " '",
               f.path.string(), "' has the name of a piece of the checkpoint ", flag, " '", checkpoint, "'",
               flag == "--save" ? ", which a save writes and later removes" : "", "; give another path");
  }
}

}  // namespace

void check_paths(const Args& a) {
  check_data(a.data);
  if (!a.save.empty()) optim::check_checkpoint_name(a.save, a.steps, a.dp * a.pp * a.tp);
  const std::vector<RunFile> files = run_files(a);
  // --save over --resume is how a run trains on: the commit keeps the old checkpoint whole until the new one is.
  const bool resume_is_save = !a.resume.empty() && !a.save.empty() && same_file(a.resume, a.save);
  for (size_t i = 0; i < files.size(); ++i) {
    const RunFile& out = files[i];
    if (!out.output) continue;
    for (size_t j = 0; j < files.size(); ++j) {
      const RunFile& other = files[j];
      if (other.group == out.group || (j < i && other.output)) continue;  // each pair of outputs once
      if (resume_is_save && out.flag.starts_with("--save") && other.flag.starts_with("--resume")) continue;
      LOOM_CHECK(!same_file(out.path, other.path), out.flag, " '", out.path.string(), "' is the same file as ",
                 other.flag, " '", other.path.string(), "': ",
                 other.output ? "one output would overwrite the other" : "writing it would destroy the input",
                 "; give another path");
    }
    // A --data directory is read whole: an output inside it would join the corpus.
    LOOM_CHECK(!fs::is_directory(a.data) || !inside(out.path, a.data), out.flag, " '", out.path.string(),
               "' is inside the --data directory '", a.data,
               "', whose files are read as the corpus; write it elsewhere");
  }
  // --export-hf replaces its folder whole when the run ends: nothing else the run reads or writes may be
  // in it (its --init-from folder may: exporting over the model one started from is a fine-tune in place).
  for (const RunFile& f : files)
    LOOM_CHECK(a.export_hf.empty() || f.flag.starts_with("--init-from") || !inside(f.path, a.export_hf), f.flag, " '",
               f.path.string(), "' is inside the --export-hf folder '", a.export_hf,
               "', which the export replaces whole; give another path");
  check_piece_names(files, "--save", a.save, /*outputs_only=*/false);
  check_piece_names(files, "--resume", a.resume, /*outputs_only=*/true);
  // A file-size limit (ulimit -f) kills a process with SIGXFSZ in the middle of a write, without a word;
  // ignored, the write fails with EFBIG ("File too large") and the file's writer says which file.
  std::signal(SIGXFSZ, SIG_IGN);
}

}  // namespace loom::train
