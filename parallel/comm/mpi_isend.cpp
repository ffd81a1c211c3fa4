// MpiProcessGroup::isend, a send posted on the caller's thread (the pipeline's
// sends; pipeline_p2p.h has the measurements). Apart from process_group_mpi.cpp
// because it is one idea: a Work that owns an MPI request and its payload.
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/comm/mpi_checks.h"
#include "parallel/comm/process_group_mpi.h"
#include "parallel/comm/watchdog.h"

namespace loom::parallel {

// ---- isend: a send posted on the caller's thread ---------------------------------
// The pipeline's sends (pipeline_p2p.h has the measurements). MPI_Isend runs
// here, so the message leaves now instead of behind the channel's queue. MPI
// then moves a send only while some thread of this process is inside MPI (its
// progress is per process: any thread's MPI_Test advances every request). A
// lone 1 MB message is an exception on one host - the receiver copies it out
// of the sender's memory (Open MPI's single-copy CMA; received in 7 ms while
// the sender slept 200 ms) - but in a running pipeline, sends left alone while
// the stage computed made 1F1B 3x slower. So the channel's thread also tests
// the send, politely (the naps of progress() above), until it is done; the
// caller's own MPI_Tests (at each pipeline verb) notice completion sooner.

namespace {

// Payloads of sends dropped before they completed (a schedule that threw):
// MPI may still read them, so they live until the process ends.
std::mutex g_abandoned_mutex;
std::vector<Tensor> g_abandoned;

class MpiSendWork final : public Work {
 public:
  MpiSendWork(Tensor payload, MPI_Request request, std::string what)
      : payload_(std::move(payload)), request_(request), what_(std::move(what)) {}
  ~MpiSendWork() override {
    if (done_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Request_free(&request_);  // MPI finishes the send in the background, reading the payload
    std::lock_guard<std::mutex> lock(g_abandoned_mutex);
    g_abandoned.push_back(std::move(payload_));
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return test();
  }
  // The caller has nothing else to do: test flat out, yielding the core
  // between tests. A send nobody receives is an error after the watchdog's
  // timeout (LOOM_COLLECTIVE_TIMEOUT), not a hang.
  void wait() override {
    static const double timeout_s = watchdog::timeout_from_env();
    const auto start = std::chrono::steady_clock::now();
    while (!is_completed()) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      LOOM_CHECK(waited < timeout_s, what_, ": not received after ", int(waited), " s (LOOM_COLLECTIVE_TIMEOUT); "
                 "does the receiving rank run the same schedule?");
      std::this_thread::yield();
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  bool test() {  // under mutex_: MPI forbids testing one request on two threads at once
    if (done_) return true;
    int flag = 0;
    try {
      mpiCheck(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    } catch (...) {
      error_ = std::current_exception();
      flag = 1;
    }
    if (flag) done_ = true, payload_ = Tensor();  // delivered: the buffer is the caller's again
    return done_;
  }

  std::mutex mutex_;
  Tensor payload_;  // alive until MPI is done reading it
  MPI_Request request_;
  std::string what_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

std::shared_ptr<Work> MpiProcessGroup::isend(const Tensor& t, int dst, int tag) {
  check_tensor("send", t, "tensor");
  check_peer("send", dst, rank_, size_, tag, name_);
  LOOM_CHECK(comm_ != MPI_COMM_NULL, "send: process group ", name_, " has been shut down (loom::parallel::finalize)");
  MPI_Request request;
  mpiCheck(MPI_Isend(t.raw_data(), int(t.numel()), mpi_type(t.dtype()), dst, tag, comm_, &request));
  auto work = std::make_shared<MpiSendWork>(t, request, str("send(to ", dst, ", tag ", tag, ") on group ", name_));
  // Progress while the caller computes: the channel's thread tests the send
  // politely until it is done (or dropped, or the group shuts down).
  std::weak_ptr<MpiSendWork> weak = work;
  queue_->submit(str("send(to ", dst, ", tag ", tag, ")"), t.nbytes(), [this, weak] {
    auto nap = std::chrono::microseconds(20);
    while (!queue_->stopping()) {
      {
        std::shared_ptr<MpiSendWork> w = weak.lock();
        if (!w || w->is_completed()) return;
      }
      queue_->nap(nap);
      nap = std::min(2 * nap, std::chrono::microseconds(200));
    }
  });
  return work;
}

}  // namespace loom::parallel
