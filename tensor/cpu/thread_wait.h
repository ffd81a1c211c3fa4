// How loom's idle math threads wait: without spinning on a core another
// program needs. OpenMP's (libgomp's) default is to spin ~300,000 times before
// sleeping, so between two parallel loops an idle thread keeps its core busy;
// on a 2-core laptop with a browser or a build on the other core, --threads 2
// then ran 2.4-19x slower than --threads 1 (issue 34; bench/threads_busy.sh).
//
// Two parts. While other programs hold the cores, parallel loops do not wake
// the other threads at all (cpu/core_watch.h). And an idle thread spins only
// briefly before it sleeps: loom sets GOMP_SPINCOUNT=10000 (well under a
// millisecond; KMP_BLOCKTIME=1 ms for LLVM's libomp, a clang build) before the
// OpenMP runtime starts, unless the user set OMP_WAIT_POLICY, GOMP_SPINCOUNT or
// KMP_BLOCKTIME: then theirs stands. Sleeping at once
// (OMP_WAIT_POLICY=passive) was measured and lost the quiet machine's speed
// (bench/README.md: 4.59 s against 2.90 s spinning, 3.20 s with 10,000). Likewise
// OPENBLAS_NUM_THREADS=1 (loom calls OpenBLAS single-threaded; its idle pool
// would spin too) unless the user set it.
//
// How: the process starts over once with those variables added (execve of
// itself, before anything has run; thread_wait.cpp says why nothing gentler
// works). A tool that follows a program only until its first exec (valgrind
// without --trace-children=yes) should be given OMP_WAIT_POLICY and
// OPENBLAS_NUM_THREADS in the environment: then nothing starts over.
#pragma once

#include <string>

namespace loom::cpu {

// What this process's OpenMP runtime was started with, in words:
// "GOMP_SPINCOUNT=10000 (loom's default)" or "OMP_WAIT_POLICY=active (set by the user)".
std::string omp_wait_policy();

}  // namespace loom::cpu
