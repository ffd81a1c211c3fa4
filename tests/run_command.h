// Running a shell command from a test (train_gpt, often under mpiexec) and
// reading what it printed: the one popen loop the tests share. The command
// runs as given through /bin/sh; callers that want stderr in the output
// append " 2>&1" themselves.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace loom::test {

struct Exec {
  int status;          // the exit code; -1 when killed by a signal (or popen failed)
  std::string output;  // everything it wrote to stdout
};

inline Exec run_command(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (!p) return {-1, "popen failed (" + std::string(std::strerror(errno)) + "): " + command};
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A program a test launches (train_gpt, mpiexec), found at run time so that
// test binaries built in one folder run from another (a GPU bundle,
// tests/cuda/build_bundle.sh): the environment variable `env` when set, else
// `name` beside this test binary (the bundle's flat bin/), else `in_build`
// (where the build tree puts it, relative to this binary's folder, or an
// absolute system path) when it exists, else `name` itself, for the PATH.
inline std::string program_path(const char* env, const char* name, const std::string& in_build) {
  if (const char* e = std::getenv(env); e && *e) return e;
  auto exists = [](const std::string& p) { return access(p.c_str(), X_OK) == 0; };
  std::string dir;
  char self[4096];
  if (const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1); n > 0) {
    dir.assign(self, size_t(n));
    dir.resize(dir.rfind('/') + 1);
  }
  if (exists(dir + name)) return dir + name;
  const std::string built = !in_build.empty() && in_build[0] == '/' ? in_build : dir + in_build;
  return !in_build.empty() && exists(built) ? built : std::string(name);
}

}  // namespace loom::test
