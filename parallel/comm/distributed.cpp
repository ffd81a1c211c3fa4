#include "parallel/comm/distributed.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <chrono>
#include <memory>
#include <thread>

#include "parallel/comm/peer_status.h"
#include "parallel/comm/process_group_mpi.h"
#include "parallel/comm/watchdog.h"

namespace loom::parallel {

namespace {

// What Open MPI allocates for itself in MPI_Init_thread and MPI_Finalize and
// never frees is not loom's leak: under AddressSanitizer (tests/sanitizers.sh)
// the leak check ignores what this thread allocates while one lives.
#if defined(__SANITIZE_ADDRESS__)
using OpenMpisOwn = __lsan::ScopedDisabler;
#else
struct OpenMpisOwn {};
#endif

std::unique_ptr<MpiProcessGroup> g_world;

// abort_job's bound on MPI_Abort (see there).
constexpr int kAbortGraceSeconds = 5;
int g_rank = 0;

// An exception nobody caught, on any thread: say which rank and what, then
// take the job down (otherwise the other ranks wait in their next collective
// until the watchdog fires).
[[noreturn]] void on_terminate() {
  std::string what = "std::terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
      what = "an exception not derived from std::exception";
    }
  }
  abort_job(str("[loom rank ", g_rank, "] uncaught exception: ", what));
}

void init_impl(int* argc, char*** argv) {
  if (g_world) return;
  double timeout = watchdog::timeout_from_env();  // a bad value fails before MPI starts
  int initialized = 0, finalized = 0, provided = 0;
  mpiCheck(MPI_Initialized(&initialized));
  mpiCheck(MPI_Finalized(&finalized));
  LOOM_CHECK(!finalized, "loom::parallel::init: MPI was already finalized; MPI cannot be started twice in a process");
  if (!initialized) {
    [[maybe_unused]] OpenMpisOwn its_own;
    mpiCheck(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  } else {
    mpiCheck(MPI_Query_thread(&provided));
  }
  // Errors come back as codes, so mpiCheck can turn them into exceptions.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
  LOOM_CHECK(provided >= MPI_THREAD_MULTIPLE, "loom::parallel::init: the MPI library provides thread level ", provided,
             " but loom needs MPI_THREAD_MULTIPLE (", int(MPI_THREAD_MULTIPLE),
             "): every process group runs its communication on its own thread");
  std::set_terminate(on_terminate);
  // loom's world is a duplicate, so raw MPI calls on MPI_COMM_WORLD (the
  // benchmarks compare against them) never interleave with loom's own.
  MPI_Comm world;
  mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  g_world = std::make_unique<MpiProcessGroup>(world, "world");
  watchdog::start(g_rank, timeout, [](const std::string& msg) { abort_job(msg); }, mpi_peers(MPI_COMM_WORLD));
}

}  // namespace

void init(int& argc, char**& argv) { init_impl(&argc, &argv); }
void init() { init_impl(nullptr, nullptr); }

bool is_initialized() { return g_world != nullptr; }

ProcessGroup& world() {
  LOOM_CHECK(g_world, "loom::parallel::world(): call loom::parallel::init(argc, argv) first");
  return *g_world;
}

void finalize() {
  if (!g_world) return;
  shutdown_all_mpi_groups();  // drains queued work while the watchdog still watches
  g_world.reset();
  watchdog::stop();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    [[maybe_unused]] OpenMpisOwn its_own;
    mpiCheck(MPI_Finalize());
  }
}

int run(int argc, char** argv, const std::function<int()>& main_fn) {
  int rc = 0;
  try {
    init(argc, argv);
    rc = main_fn();
  } catch (const std::exception& e) {
    abort_job(str("[loom rank ", g_rank, "] error: ", e.what()));
  }
  finalize();
  return rc;
}

void abort_job(const std::string& message, int exit_code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  // MPI_Abort asks mpirun to end every rank, through this host's daemon. When
  // mpirun cannot be reached (the link to its host is cut) the request may
  // never be answered, and MPI_Abort never return: leave anyway after a grace.
  try {
    std::thread([exit_code] {
      std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
      std::fprintf(stderr,
                   "[loom rank %d] MPI_Abort did not end this process within %d s (mpirun unreachable?): exiting\n",
                   g_rank, kAbortGraceSeconds);
      std::_Exit(exit_code);
    }).detach();
  } catch (...) {  // no thread to be had: MPI_Abort alone, as before
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace loom::parallel
