// bf16 GEMMs on oneDNN's matmul primitive (what and why: gemm_bf16.h).
#include "tensor/cpu/gemm_bf16.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <unordered_map>
#include <vector>

#ifdef LOOM_WITH_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/parallel.h"

namespace loom::cpu {

namespace {

// The reference for one block: op(A) and op(B) widened to fp32 (exactly),
// then sgemm (into an fp32 copy of C when C is bf16, rounded back). Used
// where oneDNN has no native kernel for a layout.
template <class TC>
void gemm_bf16_via_fp32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
                        const bfloat16* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  auto widen = [](const bfloat16* p, int64_t rows, int64_t cols, int64_t ld) {  // stored [rows, cols] -> dense fp32
    std::vector<float> out(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[size_t(r * cols + c)] = bf16_to_float(p[r * ld + c]);
    return out;
  };
  const int64_t a_cols = ta ? M : K, b_cols = tb ? K : N;  // A is stored [K, M] when transposed, B [N, K]
  std::vector<float> a = widen(A, ta ? K : M, a_cols, lda), b = widen(B, tb ? N : K, b_cols, ldb);
  if constexpr (std::is_same_v<TC, float>) {
    gemm_serial(ta, tb, M, N, K, a.data(), a_cols, b.data(), b_cols, beta, C, ldc);
  } else {
    std::vector<float> c = widen(C, M, N, ldc);
    gemm_serial(ta, tb, M, N, K, a.data(), a_cols, b.data(), b_cols, beta, c.data(), N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = float_to_bf16(c[size_t(i * N + j)]);
  }
}

#ifdef LOOM_WITH_DNNL
using dnnl::memory;

// This thread's OpenMP thread count at 1 while a primitive is made or run:
// oneDNN reads it to choose its blocking (so a primitive made inside loom's
// parallel region would otherwise be blocked for --threads threads) and,
// outside a region, to start a team of its own.
class OneOpenMPThread {
 public:
#ifdef _OPENMP
  OneOpenMPThread() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~OneOpenMPThread() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }
#else
  OneOpenMPThread() : saved_(1) {}
#endif
  OneOpenMPThread(const OneOpenMPThread&) = delete;
  OneOpenMPThread& operator=(const OneOpenMPThread&) = delete;

 private:
  int saved_;
};

// Never destroyed: the primitives in matmul_for's map, destroyed at exit, still refer to it.
const dnnl::engine& cpu_engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// One shape's primitive. native is false when oneDNN would run its reference
// kernel ("ref:any", slower than widening to fp32) or refuses the layout.
struct Bf16Matmul {
  uint64_t id;  // unique for the process: names this primitive in each thread's Arguments
  dnnl::matmul prim;
  memory::desc a, b, c, scratchpad;
  bool native = false;
};

std::shared_ptr<const Bf16Matmul> make_matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                                              int64_t ldb, int64_t ldc, float beta, memory::data_type c_type) {
  static std::atomic<uint64_t> next_id{0};
  auto m = std::make_shared<Bf16Matmul>();
  m->id = next_id++;
  using dims = memory::dims;
  m->a = memory::desc({M, K}, memory::data_type::bf16, ta ? dims{1, lda} : dims{lda, 1});  // A [M, K]
  m->b = memory::desc({K, N}, memory::data_type::bf16, tb ? dims{1, ldb} : dims{ldb, 1});  // B [K, N]
  m->c = memory::desc({M, N}, c_type, dims{ldc, 1});                                       // C [M, N]
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // each thread brings its own (scratchpad() below)
  if (beta != 0) {  // C = beta * C + A B: oneDNN's "sum" post-op
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(m->a, m->b, m->c), attr, cpu_engine());
    if (std::strncmp(pd.impl_info_str(), "ref", 3) == 0) return m;
    m->prim = dnnl::matmul(pd);
    m->scratchpad = pd.scratchpad_desc();
    m->native = true;
  } catch (const dnnl::error&) {  // no implementation for this layout
  }
  return m;
}

// A training run uses a few dozen shapes; past this many (shapes that keep
// changing) the maps below start over rather than growing without end.
constexpr size_t kMaxEntries = 4096;

// Primitives by (M, N, K, transposes, lda, ldb, ldc, beta's bits, C's dtype).
std::shared_ptr<const Bf16Matmul> matmul_for(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                                             int64_t ldb, int64_t ldc, float beta, memory::data_type c_type) {
  using Key = std::array<int64_t, 9>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const Bf16Matmul>> cache;
  uint32_t beta_bits;
  std::memcpy(&beta_bits, &beta, sizeof(beta_bits));
  const Key key{M, N, K, int64_t(ta) | int64_t(tb) << 1, lda, ldb, ldc, int64_t(beta_bits), int64_t(c_type)};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxEntries) cache.clear();  // entries in use live on in their callers' shared_ptr
  return cache[key] = make_matmul(ta, tb, M, N, K, lda, ldb, ldc, beta, c_type);
}

// This thread's argument list for one primitive: memory objects made once and
// pointed at each call's matrices (set_data_handle) and scratchpad.
struct Arguments {
  memory a, b, c, scratchpad;
  std::unordered_map<int, memory> args;
};
Arguments& arguments_for(const Bf16Matmul& m) {
  thread_local std::unordered_map<uint64_t, Arguments> by_id;
  auto it = by_id.find(m.id);
  if (it != by_id.end()) return it->second;
  if (by_id.size() >= kMaxEntries) by_id.clear();
  const dnnl::engine& e = cpu_engine();
  Arguments& r = by_id[m.id];
  r.a = memory(m.a, e, nullptr);
  r.b = memory(m.b, e, nullptr);
  r.c = memory(m.c, e, nullptr);
  r.scratchpad = memory(m.scratchpad, e, nullptr);
  r.args = {{DNNL_ARG_SRC, r.a}, {DNNL_ARG_WEIGHTS, r.b}, {DNNL_ARG_DST, r.c}, {DNNL_ARG_SCRATCHPAD, r.scratchpad}};
  return r;
}

// This thread's scratchpad (packed blocks of B, fp32 partial sums), grown to the largest asked for.
void* scratchpad(size_t bytes) {
  struct Buffer {
    void* p = nullptr;
    size_t size = 0;
    ~Buffer() { ::operator delete(p, std::align_val_t(64)); }
  };
  thread_local Buffer buffer;
  if (bytes > buffer.size) {
    ::operator delete(buffer.p, std::align_val_t(64));
    buffer.p = ::operator new(bytes, std::align_val_t(64));
    buffer.size = bytes;
  }
  return buffer.p;
}
#endif

}  // namespace

bool bf16_gemm_hardware() {
#ifdef LOOM_WITH_DNNL
  // oneDNN's ISA masks nest: AMX's includes avx512_core_bf16's bits.
  static const bool has = (unsigned(dnnl_get_effective_cpu_isa()) & unsigned(dnnl_cpu_isa_avx512_core_bf16)) ==
                          unsigned(dnnl_cpu_isa_avx512_core_bf16);
  return has;
#else
  return false;
#endif
}

std::atomic<bool>& bf16_gemm_switch() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("LOOM_GEMM_BF16");
    return bf16_gemm_hardware() && !(env && std::strcmp(env, "fp32") == 0);
  }()};
  return on;
}

namespace {

template <class TC>
void serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda, const bfloat16* B,
            int64_t ldb, float beta, TC* C, int64_t ldc) {
#ifdef LOOM_WITH_DNNL
  blas_single_threaded();
  OneOpenMPThread one;
  const auto c_type = std::is_same_v<TC, float> ? memory::data_type::f32 : memory::data_type::bf16;
  std::shared_ptr<const Bf16Matmul> m = matmul_for(ta, tb, M, N, K, lda, ldb, ldc, beta, c_type);
  if (m->native) {
    thread_local dnnl::stream stream(cpu_engine());
    Arguments& arg = arguments_for(*m);
    arg.a.set_data_handle(const_cast<bfloat16*>(A));
    arg.b.set_data_handle(const_cast<bfloat16*>(B));
    arg.c.set_data_handle(C);
    arg.scratchpad.set_data_handle(scratchpad(m->scratchpad.get_size()));
    m->prim.execute(stream, arg.args);
    return;
  }
#endif
  gemm_bf16_via_fp32(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

// gemm.h's split over the math threads, each part on the bf16 kernel.
template <class TC>
void split(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda, const bfloat16* B,
           int64_t ldb, float beta, TC* C, int64_t ldc) {
  split_rows_or_columns(ta, tb, M, N, K, A, lda, B, ldb, C, ldc,
                        [&](int64_t m, int64_t n, const bfloat16* a, const bfloat16* b, TC* c) {
                          serial(ta, tb, m, n, K, a, lda, b, ldb, beta, c, ldc);
                        });
}

}  // namespace

void gemm_bf16_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
                      const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  serial(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}
void gemm_bf16_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
                      const bfloat16* B, int64_t ldb, float beta, bfloat16* C, int64_t ldc) {
  serial(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
               const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  split(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bfloat16* A, int64_t lda,
               const bfloat16* B, int64_t ldb, float beta, bfloat16* C, int64_t ldc) {
  split(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace loom::cpu
