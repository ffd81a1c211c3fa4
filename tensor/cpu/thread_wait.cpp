// Starts the OpenMP runtime with GOMP_SPINCOUNT=10000 (libgomp) and
// KMP_BLOCKTIME=1 (LLVM's libomp) (see thread_wait.h).
//
// libgomp reads its environment once, in its own constructor, which the
// dynamic loader runs before main() and before any constructor of the
// program: a setenv() in main() comes too late. What runs earlier is the
// executable's .preinit_array - but glibc has not set up `environ` yet there
// (getenv finds nothing, and whatever setenv adds is overwritten), so the one
// way to hand libgomp a variable is to start over: execve the same program,
// same arguments, with GOMP_SPINCOUNT=10000 added to its environment. It
// happens once (the new process finds a mark in its environment), before anything
// else has run (same pid, so mpirun and the shell see nothing), and costs a
// few milliseconds. loom_tensor is a static library: its CMakeLists.txt makes
// every program that links it keep this object (-u loom_omp_wait_policy_preinit).
#include "tensor/cpu/thread_wait.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace {

bool starts_with(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

}  // namespace

namespace loom::cpu {

std::string omp_wait_policy() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* mark = std::getenv("LOOM_OMP_WAIT_POLICY_SET");
  const bool ours = mark && std::string(mark) == "1";
  if (spin && !policy) return std::string("GOMP_SPINCOUNT=") + spin + (ours ? " (loom's default)" : " (set by the user)");
  if (!policy) return "OMP_WAIT_POLICY unset (OpenMP's default: spin, then sleep)";
  return std::string("OMP_WAIT_POLICY=") + policy + (ours ? " (loom's default)" : " (set by the user)");
}

}  // namespace loom::cpu

// The loader calls it with (argc, argv, envp) before any library's constructor.
extern "C" void loom_omp_wait_policy_preinit(int, char** argv, char** envp) {
  if (!argv || !envp) return;
  size_t n = 0;
  bool has_policy = false, has_blas_threads = false;
  for (; envp[n]; ++n) {
    if (starts_with(envp[n], "LOOM_OMP_WAIT_POLICY_SET=")) return;  // the second start: never a third
    has_policy |= starts_with(envp[n], "OMP_WAIT_POLICY=") || starts_with(envp[n], "GOMP_SPINCOUNT=") ||
                  starts_with(envp[n], "KMP_BLOCKTIME=");
    has_blas_threads |= starts_with(envp[n], "OPENBLAS_NUM_THREADS=");
  }
  if (has_policy && has_blas_threads) return;  // the user's choices stand
  // A sleeping thread costs a few microseconds to wake; OpenMP's default
  // spin holds a whole core for ~300,000 pauses after every loop. 10,000
  // pauses (well under a millisecond) bridge the gaps between the main job's
  // loops; a longer idle time sleeps (thread_wait.h has the measurements).
  static char policy[] = "GOMP_SPINCOUNT=10000";
  // The same for LLVM's OpenMP runtime (libomp: a clang build), which reads
  // KMP_BLOCKTIME instead, in milliseconds (default 200: a whole loop's gap
  // and more). Each runtime ignores the other's variable.
  static char blocktime[] = "KMP_BLOCKTIME=1";
  // The mark says the process has been started over (so it is not again), and
  // whose OMP_WAIT_POLICY it runs with (omp_wait_policy()).
  static char ours[] = "LOOM_OMP_WAIT_POLICY_SET=1", theirs[] = "LOOM_OMP_WAIT_POLICY_SET=0";
  // loom calls OpenBLAS single-threaded, always (cpu/gemm.h); without this it
  // still starts a thread per core at load, which spins ~0.1 s before sleeping.
  static char blas[] = "OPENBLAS_NUM_THREADS=1";
  char** env = static_cast<char**>(std::malloc((n + 5) * sizeof(char*)));
  if (!env) return;
  std::memcpy(env, envp, n * sizeof(char*));
  if (!has_policy) env[n++] = policy, env[n++] = blocktime;
  env[n++] = has_policy ? theirs : ours;
  if (!has_blas_threads) env[n++] = blas;
  env[n] = nullptr;
  // The program's own path, not /proc/self/exe: the process keeps its name
  // (ps, top, pgrep show train_gpt, not "exe").
  static char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) {
    self[len] = '\0';
    execve(self, argv, env);
  }
  execve("/proc/self/exe", argv, env);  // returns only if it failed (no /proc): then OpenMP's default stands
  std::free(env);
}

// Every pointer in the executable's .preinit_array is called before the
// shared libraries' constructors (glibc's _dl_init; AddressSanitizer starts the same way).
__attribute__((section(".preinit_array"), used)) static void (*loom_preinit_wait_policy)(int, char**, char**) =
    &loom_omp_wait_policy_preinit;
