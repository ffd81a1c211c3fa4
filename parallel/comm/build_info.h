// What of a rank's build and environment changes the numbers it computes or
// how it talks to other ranks, for the start-up handshake (handshake.h): a
// release rank and a sanitizer rank, one built with CUDA and one without, two
// compilers or two vector ISAs (FMA contracts a*b+c in one rounding) would
// pass the flag check and drift apart - caught at the first save's replica
// check, or never. Compared before the first collective instead:
//   ranks disagree on the build (...): sanitizers: 'address' on rank 0; 'none' on rank 1
#pragma once

#include "parallel/comm/handshake.h"

namespace loom::parallel {

// loom version, compiler, optimization and assertions, fast-math, vector ISA,
// sanitizers, CUDA and NCCL, and the environment variables that pick kernels
// (LOOM_GEMM, LOOM_GEMM_BF16, LOOM_ATTENTION). Tests fake a differing build
// with LOOM_TEST_BUILD_NOTE, one more field when set.
RunFields build_fields();

}  // namespace loom::parallel
