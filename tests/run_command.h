// Running a shell command from a test (train_gpt, often under mpiexec) and
// reading what it printed: the one popen loop the tests share. The command
// runs as given through /bin/sh; callers that want stderr in the output
// append " 2>&1" themselves.
#pragma once

#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
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

}  // namespace loom::test
