#include "parallel/comm/build_info.h"

#include <cstdlib>
#include <string>

#include "parallel/comm/process_group_nccl.h"
#include "tensor/device.h"

#ifndef LOOM_VERSION
#define LOOM_VERSION "unknown"
#endif

namespace loom::parallel {

namespace {

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

// The ISA extensions that change results: wider vectors reorder sums, FMA rounds once.
std::string vector_isa() {
  std::string s;
#ifdef __AVX512F__
  s += "avx512f ";
#endif
#ifdef __AVX2__
  s += "avx2 ";
#endif
#ifdef __FMA__
  s += "fma ";
#endif
#ifdef __ARM_NEON
  s += "neon ";
#endif
  return s.empty() ? "baseline" : s.substr(0, s.size() - 1);
}

std::string sanitizers() {
  std::string s;
#if defined(__SANITIZE_ADDRESS__)
  s += "address ";
#endif
#if defined(__SANITIZE_THREAD__)
  s += "thread ";
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
  s += "address ";
#endif
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
  s += "thread ";
#endif
#if __has_feature(undefined_behavior_sanitizer)
  s += "undefined ";
#endif
#endif
  return s.empty() ? "none" : s.substr(0, s.size() - 1);
}

std::string env_or_unset(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string("'") + v + "'" : "(unset)";
}

}  // namespace

RunFields build_fields() {
  RunFields f = {
      {"loom version", LOOM_VERSION},
      {"compiler", compiler()},
#ifdef __OPTIMIZE__
      {"optimized", "yes"},
#else
      {"optimized", "no"},
#endif
#ifdef NDEBUG
      {"assertions", "off"},
#else
      {"assertions", "on"},
#endif
#ifdef __FAST_MATH__
      {"fast-math", "on"},
#else
      {"fast-math", "off"},
#endif
      {"vector ISA", vector_isa()},
      {"sanitizers", sanitizers()},
      {"CUDA", built_with_cuda() ? "on" : "off"},
      {"NCCL", built_with_nccl() ? "on" : "off"},
      {"LOOM_GEMM", env_or_unset("LOOM_GEMM")},
      {"LOOM_GEMM_BF16", env_or_unset("LOOM_GEMM_BF16")},
      {"LOOM_ATTENTION", env_or_unset("LOOM_ATTENTION")},
  };
  if (const char* note = std::getenv("LOOM_TEST_BUILD_NOTE")) f.emplace_back("test build note", note);
  return f;
}

}  // namespace loom::parallel
