#include "tensor/cuda/context.h"

#include <atomic>
#include <mutex>
#include <string>

#include "tensor/cuda/check.h"
#include "tensor/cuda/cuda.h"

namespace loom::cuda {
namespace {

constexpr int kMaxDevices = 16;

struct DeviceContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  IndexError* index_error_device = nullptr;  // device memory: the kernels' atomicCAS claims it there
  IndexError* index_error = nullptr;         // pinned host copy, brought down at each synchronisation
};

std::mutex g_mutex;
DeviceContext g_contexts[kMaxDevices];
std::atomic<bool> g_allow_tf32{false};

// The runtime is asked once; a machine without a GPU (or without a driver)
// answers 0 devices and the reason, which check_device repeats.
struct DeviceCount {
  int count = 0;
  std::string reason;
};

const DeviceCount& probe() {
  static const DeviceCount result = [] {
    DeviceCount r;
    cudaError_t err = cudaGetDeviceCount(&r.count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: a CUDA build must keep working on CPU tensors
      r.count = 0;
      r.reason = str("cudaGetDeviceCount: ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
    } else if (r.count == 0) {
      r.reason = "cudaGetDeviceCount reports 0 devices";
    }
    return r;
  }();
  return result;
}

}  // namespace

int device_count() { return probe().count; }
bool is_available() { return device_count() > 0; }
std::string unavailable_reason() { return probe().reason; }

void check_device(const Device& d) {
  const DeviceCount& p = probe();
  LOOM_CHECK(p.count > 0, "device ", d.str(), ": no CUDA device is available (", p.reason,
             "); loom was built with CUDA, but on this machine only CPU tensors can be made");
  LOOM_CHECK(d.index < p.count, "device ", d.str(), ": index ", d.index, " is past the last GPU: this machine has ",
             p.count, p.count == 1 ? " CUDA device (cuda:0)" : str(" CUDA devices (cuda:0 .. cuda:", p.count - 1, ")"));
  LOOM_CHECK(d.index < kMaxDevices, "device ", d.str(), ": loom supports at most ", kMaxDevices, " GPUs per process");
}

namespace {
// Whether this thread has a device yet. A thread that never set one reads
// device 0 from cudaGetDevice (the runtime's default, not a choice), and
// setting that back would make a context on GPU 0 for every rank's threads.
thread_local bool t_has_device = false;
}  // namespace

DeviceGuard::DeviceGuard(const Device& d) {
  int current = 0;
  CUDA_CHECK(cudaGetDevice(&current));
  if (current != d.index) CUDA_CHECK(cudaSetDevice(d.index));
  // The thread's first guard sets its rank's device once, for good (the main,
  // comm and watchdog threads alike); later guards restore what they found.
  previous_ = t_has_device && current != d.index ? current : -1;
  t_has_device = true;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // a destructor must not throw
}

cudaStream_t stream(const Device& d) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceContext& c = g_contexts[d.index];
  if (!c.stream) {
    check_device(d);
    DeviceGuard guard(d);
    // Non-blocking: loom's stream does not wait on the legacy default stream
    // (other libraries' work), and every loom copy goes through it explicitly.
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  }
  return c.stream;
}

cublasHandle_t cublas_handle(const Device& d) {
  cudaStream_t s = stream(d);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceContext& c = g_contexts[d.index];
  if (!c.cublas) {
    DeviceGuard guard(d);
    CUBLAS_CHECK(cublasCreate(&c.cublas));
    CUBLAS_CHECK(cublasSetStream(c.cublas, s));
  }
  return c.cublas;
}

IndexError* index_error_slot(const Device& d) {
  cudaStream_t s = stream(d);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceContext& c = g_contexts[d.index];
  if (!c.index_error_device) {
    DeviceGuard guard(d);
    void* host = nullptr;
    CUDA_CHECK(cudaHostAlloc(&host, sizeof(IndexError), cudaHostAllocDefault));
    c.index_error = static_cast<IndexError*>(host);
    *c.index_error = IndexError{0, 0, 0};
    void* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, sizeof(IndexError)));
    // On the stream, so the kernel that receives the slot runs after the zeros land.
    CUDA_CHECK(cudaMemsetAsync(dev, 0, sizeof(IndexError), s));
    c.index_error_device = static_cast<IndexError*>(dev);
  }
  return c.index_error_device;
}

void enqueue_index_error_copy(const Device& d) {
  IndexError *dev = nullptr, *host = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    dev = g_contexts[d.index].index_error_device, host = g_contexts[d.index].index_error;
  }
  if (!dev) return;  // no kernel that checks indices has run on d
  DeviceGuard guard(d);
  CUDA_CHECK(cudaMemcpyAsync(host, dev, sizeof(IndexError), cudaMemcpyDeviceToHost, stream(d)));
}

void throw_if_index_error(const Device& d) {
  IndexError *e = nullptr, *dev = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    e = g_contexts[d.index].index_error, dev = g_contexts[d.index].index_error_device;
  }
  if (!e) return;  // no kernel that checks indices has run on d
  const IndexError found = *e;  // the copy enqueue_index_error_copy made, finished by the caller's sync
  if (found.op == int64_t(IndexOp::None)) return;
  *e = IndexError{0, 0, 0};
  {
    DeviceGuard guard(d);  // cleared on the stream: later kernels may record the next one
    CUDA_CHECK(cudaMemsetAsync(dev, 0, sizeof(IndexError), stream(d)));
  }
  // Worded as the CPU ops word the same error.
  struct Wording { const char* op; const char* what; const char* before_limit; const char* after_limit; };
  static const Wording words[] = {{"", "", "", ""},
                                  {"embedding", "index", "", " rows"},
                                  {"embedding_backward", "index", "", " rows"},
                                  {"cross_entropy", "target", "", " classes"},
                                  {"cross_entropy_backward", "target", "", " classes"},
                                  {"index_select", "index", "size ", ""},
                                  {"gather", "index", "size ", ""},
                                  {"index_add", "index", "size ", ""},
                                  {"scatter_add", "index", "size ", ""}};
  LOOM_CHECK(found.op > 0 && found.op <= int64_t(IndexOp::ScatterAdd), "internal error: unknown bad-index record ",
             found.op, " on ", d.str());
  const Wording& w = words[found.op];
  throw Error(str(w.op, ": ", w.what, " ", found.index, " out of range for ", w.before_limit, found.limit,
                  w.after_limit, " (found on ", d.str(), " by a kernel; reported at the next synchronisation)"));
}

void synchronize(const Device& d) {
  if (!d.is_cuda()) return;
  DeviceGuard guard(d);
  enqueue_index_error_copy(d);
  CUDA_CHECK(cudaStreamSynchronize(stream(d)));
  throw_if_index_error(d);
}

namespace {
thread_local bool t_defer_index_errors = false;
}  // namespace
DeferIndexErrors::DeferIndexErrors() : saved_(t_defer_index_errors) { t_defer_index_errors = true; }
DeferIndexErrors::~DeferIndexErrors() { t_defer_index_errors = saved_; }
bool DeferIndexErrors::active() { return t_defer_index_errors; }

TimingEvent record_timing_event(const Device& d, void* s) {
  check_device(d);
  DeviceGuard guard(d);  // an event belongs to the device current when it is made
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));  // with timing (the default flags)
  const cudaError_t r = cudaEventRecord(e, s ? static_cast<cudaStream_t>(s) : stream(d));
  if (r != cudaSuccess) (void)cudaEventDestroy(e);
  CUDA_CHECK(r);
  return TimingEvent{e, d.index};
}

double elapsed_ms(const TimingEvent& a, const TimingEvent& b) {
  LOOM_CHECK(a.event && b.event, "elapsed_ms: an empty timing event");
  LOOM_CHECK(a.device == b.device, "elapsed_ms: events of cuda:", a.device, " and cuda:", b.device,
             " (a time between them needs one device's clock)");
  DeviceGuard guard(Device(DeviceType::CUDA, a.device));
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(a.event)));
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(b.event)));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a.event), static_cast<cudaEvent_t>(b.event)));
  return double(ms);
}

void destroy_timing_event(TimingEvent& e) {
  if (e.event) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e.event));
  e = TimingEvent{};
}

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

}  // namespace loom::cuda
