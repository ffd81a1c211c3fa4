// MpiProcessGroup::isend and ::irecv: point-to-point transfers posted on the
// caller's thread (the pipeline's; pipeline_channels.h says why, bench/README.md
// has the measurements). Apart from process_group_mpi.cpp because it is one
// idea: a Work that owns an MPI request and the buffer MPI reads or writes.
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/mpi_checks.h"
#include "parallel/comm/process_group_mpi.h"
#include "parallel/comm/watchdog.h"
#include "tensor/ops.h"

namespace loom::parallel {

// ---- posted on the caller's thread -----------------------------------------------
// MPI_Isend / MPI_Irecv run here, so the transfer starts now instead of behind
// the channel's queue, and a receive waited for here costs no hand-off to the
// queue's thread and back. MPI moves a transfer only while some thread of this
// process is inside MPI (its progress is per process: any thread's MPI_Test
// advances every request). A lone 1 MB message is an exception on one host -
// the receiver copies it out of the sender's memory (Open MPI's single-copy
// CMA; received in 7 ms while the sender slept 200 ms) - but in a running
// pipeline, sends left alone while the stage computed made 1F1B 3x slower
// (64 KB activations: 58-66 ms a step against 33-35). So the channel's thread
// also tests a send that is still in flight kLatePoll after it was posted, and
// then every kLatePoll until it is done; the caller's own MPI_Tests (each
// pipeline verb's receive, finish_sends) usually see it done first.

namespace {

// Buffers of transfers dropped before they completed (a schedule that threw):
// MPI may still read or write them, so they live until the process ends.
std::mutex g_abandoned_mutex;
std::vector<Tensor> g_abandoned;

// How long a send is left to the caller's own tests before the channel's
// thread tests it too (measured, bench/README.md: at 100 us the wake-ups still
// cost 128 KB transfers ~20%; at 500 us and 2 ms whole steps were the same).
constexpr std::chrono::microseconds kLatePoll(500);

class MpiRequestWork final : public Work {
 public:
  // expected_count >= 0: a receive, whose message must hold that many elements.
  // destination: a receive into a CUDA tensor lands in `buffer` (host) and
  // is copied up to it when the receive completes (HostStaging in mpi_checks.h).
  MpiRequestWork(Tensor buffer, MPI_Request request, std::string what, int64_t expected_count = -1,
                 Tensor destination = Tensor())
      : buffer_(std::move(buffer)), request_(request), what_(std::move(what)), expected_count_(expected_count),
        destination_(std::move(destination)) {}
  ~MpiRequestWork() override {
    if (done_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      if (expected_count_ >= 0) MPI_Cancel(&request_);  // a receive nobody sent to
      MPI_Request_free(&request_);  // MPI finishes a send in the background, reading the buffer
    }
    std::lock_guard<std::mutex> lock(g_abandoned_mutex);
    g_abandoned.push_back(std::move(buffer_));
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return test();
  }
  // Done as far as the last test saw, without calling MPI.
  bool known_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  // The caller has nothing else to do: test flat out, yielding the core
  // between tests. A transfer whose peer never comes is an error after the
  // watchdog's timeout (LOOM_COLLECTIVE_TIMEOUT), not a hang.
  void wait() override {
    static const double timeout_s = watchdog::timeout_from_env();
    const auto start = std::chrono::steady_clock::now();
    while (!is_completed()) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      LOOM_CHECK(waited < timeout_s, what_, expected_count_ >= 0 ? ": nothing arrived" : ": not received", " after ",
                 int(waited), " s (LOOM_COLLECTIVE_TIMEOUT); does the other rank run the same schedule?");
      std::this_thread::yield();
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  bool test() {  // under mutex_: MPI forbids testing one request on two threads at once
    if (done_) return true;
    int flag = 0;
    try {
      MPI_Status status;
      mpiCheck(MPI_Test(&request_, &flag, &status));
      if (flag && expected_count_ >= 0) {
        int count = 0;
        mpiCheck(MPI_Get_count(&status, mpi_type(buffer_.dtype()), &count));
        LOOM_CHECK(count == expected_count_, what_, ": expected ", expected_count_, " elements (",
                   buffer_.describe(), ") but the message holds ", count);
        if (destination_.defined()) ops::copy_(destination_, buffer_);  // up to the GPU, on loom's stream
      }
    } catch (...) {
      error_ = std::current_exception();
      flag = 1;
    }
    if (flag) done_ = true, buffer_ = Tensor();  // finished: the buffer is the caller's again
    return done_;
  }

  std::mutex mutex_;
  Tensor buffer_;  // alive until MPI is done with it
  MPI_Request request_;
  std::string what_;
  int64_t expected_count_;
  Tensor destination_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

std::shared_ptr<Work> MpiProcessGroup::isend(const Tensor& t, int dst, int tag) {
  check_tensor("send", t, "tensor");
  check_peer("send", dst, rank_, size_, tag, name_);
  LOOM_CHECK(comm_ != MPI_COMM_NULL, "send: process group ", name_, " has been shut down (loom::parallel::finalize)");
  HostStaging staged(t, /*fetch=*/true);  // a CUDA tensor's values come down now, on this thread
  MPI_Request request;
  mpiCheck(MPI_Isend(staged.host().raw_data(), int(t.numel()), mpi_type(t.dtype()), dst, tag, comm_, &request));
  auto work = std::make_shared<MpiRequestWork>(staged.host(), request,
                                               str("send(to ", dst, ", tag ", tag, ") on group ", name_));
  // Progress while the caller computes: the channel's thread tests the send
  // every kLatePoll until it is done (or dropped, or the group shuts down).
  // Not at once: the caller's next verb usually finds it done first, and a
  // test here would wake this thread and contend for MPI's lock just then.
  std::weak_ptr<MpiRequestWork> weak = work;
  queue_->submit(str("send(to ", dst, ", tag ", tag, ")"), t.nbytes(), [this, weak] {
    for (;;) {
      {
        std::shared_ptr<MpiRequestWork> w = weak.lock();
        if (!w || w->known_done()) return;  // no MPI call: a burst of finished sends drains at once
      }
      queue_->nap(kLatePoll);
      if (queue_->stopping()) return;
      std::shared_ptr<MpiRequestWork> w = weak.lock();
      if (!w || w->is_completed()) return;
    }
  });
  return work;
}

std::shared_ptr<Work> MpiProcessGroup::irecv(const Tensor& t, int src, int tag) {
  check_tensor("recv", t, "tensor");
  check_peer("recv", src, rank_, size_, tag, name_);
  LOOM_CHECK(comm_ != MPI_COMM_NULL, "recv: process group ", name_, " has been shut down (loom::parallel::finalize)");
  HostStaging staged(t, /*fetch=*/false);
  MPI_Request request;
  mpiCheck(MPI_Irecv(staged.host().raw_data(), int(t.numel()), mpi_type(t.dtype()), src, tag, comm_, &request));
  return std::make_shared<MpiRequestWork>(staged.host(), request,
                                          str("recv(from ", src, ", tag ", tag, ") on group ", name_), t.numel(),
                                          staged.host().is_same(t) ? Tensor() : t);
}

}  // namespace loom::parallel
