#include "parallel/comm/peer_status.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <list>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/process_group_mpi.h"

namespace loom::parallel {

namespace {

constexpr int kQuestion = 1, kAnswer = 2;
constexpr int kMaxAnswer = 4096;  // bytes; longer states are cut

class MpiPeers final : public watchdog::Peers {
 public:
  explicit MpiPeers(MPI_Comm world) {
    mpiCheck(MPI_Comm_dup(world, &comm_));
    mpiCheck(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    mpiCheck(MPI_Comm_rank(comm_, &rank_));
    mpiCheck(MPI_Comm_size(comm_, &size_));
    char name[HOST_NAME_MAX + 1] = {};
    gethostname(name, HOST_NAME_MAX);
    std::vector<char> all(size_t(size_) * sizeof(name));
    mpiCheck(MPI_Allgather(name, sizeof(name), MPI_CHAR, all.data(), sizeof(name), MPI_CHAR, comm_));
    for (int r = 0; r < size_; ++r) hosts_.emplace_back(all.data() + size_t(r) * sizeof(name));
    post_question_receive();
  }

  // Only at finalize, when every rank got here: no question can be in flight
  // any more unless some rank's watchdog fired, and then the job is aborting.
  ~MpiPeers() override {
    MPI_Cancel(&question_);
    MPI_Wait(&question_, MPI_STATUS_IGNORE);
    for (auto& s : sends_)
      if (s.request != MPI_REQUEST_NULL) MPI_Request_free(&s.request);  // an answer to a rank that aborted
    MPI_Comm_free(&comm_);
  }

  void serve(const std::function<std::string()>& state) override {
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      if (MPI_Test(&question_, &arrived, &status) != MPI_SUCCESS || !arrived) break;
      std::string answer = state().substr(0, kMaxAnswer - 1);
      send(status.MPI_SOURCE, kAnswer, answer);
      post_question_receive();
    }
    finish_sends();
  }

  std::string ask(const std::string& my_state, double seconds, bool* busy_peer) override {
    // answers_[r]: rank r's state, written by its watchdog thread. A member:
    // a late answer may still land after this returns, while the job aborts.
    answers_.assign(size_, std::vector<char>(kMaxAnswer));
    std::vector<std::vector<char>>& answers = answers_;
    std::vector<MPI_Request> pending(size_, MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      send(r, kQuestion, "");
      MPI_Irecv(answers[r].data(), kMaxAnswer, MPI_CHAR, r, kAnswer, comm_, &pending[r]);
    }
    // Wait, answering the others meanwhile (they may be asking us at the same moment).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::vector<int> length(size_, -1);
    int missing = size_ - 1;
    while (missing > 0 && std::chrono::steady_clock::now() < deadline) {
      serve([&] { return my_state; });
      for (int r = 0; r < size_; ++r) {
        int done = 0;
        MPI_Status status;
        if (pending[r] == MPI_REQUEST_NULL || MPI_Test(&pending[r], &done, &status) != MPI_SUCCESS || !done) continue;
        MPI_Get_count(&status, MPI_CHAR, &length[r]);
        --missing;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // Unanswered requests stay posted: the job is about to be aborted.
    std::string silent, answered;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (length[r] < 0) silent += str(silent.empty() ? "" : ", ", "rank ", r, " (", hosts_[r], ")");
      else answered += str(" Rank ", r, " (", hosts_[r], "): ", std::string(answers[r].data(), size_t(length[r])), ".");
      if (busy_peer && length[r] > 0 && std::string(answers[r].data(), size_t(length[r])).starts_with(watchdog::kBusy))
        *busy_peer = true;
    }
    if (!silent.empty())
      return str("No answer within ", seconds, " s from ", silent,
                 ": a peer is unreachable or dead (its host down, the network link to it cut, or the process "
                 "frozen), not a rank that skipped a collective.",
                 answered.empty() ? "" : " The ranks that answered:", answered);
    return str("Every rank answered, so none is dead or cut off; where they are (this rank, ", hosts_[rank_], ": ",
               my_state, "):", answered,
               busy_peer && *busy_peer ? " A rank busy outside collectives is slow (its disk, say), not out of order."
                                       : " A rank that is not in this collective skipped it or issued its collectives "
                                         "in a different order.");
  }

 private:
  struct Send {
    std::string bytes;  // kept alive until the send completes
    MPI_Request request;
  };

  void post_question_receive() {
    MPI_Irecv(&question_byte_, 1, MPI_CHAR, MPI_ANY_SOURCE, kQuestion, comm_, &question_);
  }
  void send(int to, int tag, const std::string& bytes) {
    sends_.push_back({bytes, MPI_REQUEST_NULL});
    Send& s = sends_.back();
    MPI_Isend(s.bytes.data(), int(s.bytes.size()), MPI_CHAR, to, tag, comm_, &s.request);
  }
  void finish_sends() {
    std::erase_if(sends_, [](Send& s) {
      int done = 0;
      MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<std::string> hosts_;  // by rank
  char question_byte_ = 0;
  MPI_Request question_ = MPI_REQUEST_NULL;
  std::list<Send> sends_;  // a list: MPI holds the address of each one's bytes
  std::vector<std::vector<char>> answers_;
};

}  // namespace

std::unique_ptr<watchdog::Peers> mpi_peers(MPI_Comm world) { return std::make_unique<MpiPeers>(world); }

}  // namespace loom::parallel
