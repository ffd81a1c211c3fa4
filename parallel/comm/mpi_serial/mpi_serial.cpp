// One process's MPI (mpi.h beside this says why): collectives copy, and a
// message to oneself waits in a queue until a receive with its communicator
// and tag takes it, as MPI matches messages.
#include "mpi.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

struct loom_mpi_request {
  bool receive = false, done = false, cancelled = false;
  MPI_Comm comm = MPI_COMM_NULL;
  int tag = 0;
  void* buf = nullptr;                     // a receive's buffer
  int capacity_bytes = 0;                  // its size
  std::vector<unsigned char> bytes;        // a message not yet received (a copy: a send completes at once)
  MPI_Status status{0, 0, MPI_SUCCESS, 0};
};

namespace {

std::mutex mu;                           // MPI_THREAD_MULTIPLE: loom's comm threads call in too
std::list<std::unique_ptr<loom_mpi_request>> unexpected;  // sent, no receive posted yet (owned here)
std::list<loom_mpi_request*> posted;      // receives posted, no message yet (owned by their MPI_Request)
int next_comm = MPI_COMM_WORLD + 1;
bool initialized = false, finalized = false;

bool matches(const loom_mpi_request& recv, MPI_Comm comm, int tag) {
  return recv.comm == comm && (recv.tag == MPI_ANY_TAG || recv.tag == tag);
}

// A message's bytes into a posted receive: both done.
int deliver(loom_mpi_request& recv, const void* data, int n, int tag) {
  const int copied = std::min(n, recv.capacity_bytes);
  if (copied > 0) std::memcpy(recv.buf, data, size_t(copied));
  recv.done = true;
  recv.status = {0, tag, n > recv.capacity_bytes ? MPI_ERR_TRUNCATE : MPI_SUCCESS, copied};
  return recv.status.MPI_ERROR;
}

int one_rank(int rank) { return rank == 0 || rank == MPI_ANY_SOURCE ? MPI_SUCCESS : MPI_ERR_RANK; }

void copy(const void* send, void* recv, int count, MPI_Datatype type) {
  if (send != MPI_IN_PLACE && send != recv && count > 0) std::memcpy(recv, send, size_t(count) * size_t(type));
}

}  // namespace

extern "C" {

int MPI_Init_thread(int*, char***, int required, int* provided) {
  // Under mpirun with more ranks than one, each process would think it is the
  // whole world and train alone: refuse (Open MPI and MPICH set these).
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* n = std::getenv(var);
    if (n && std::atoi(n) > 1) {
      std::fprintf(stderr, "loom was built without MPI (-DLOOM_MPI=OFF): one process only, but %s=%s\n", var, n);
      return MPI_ERR_OTHER;
    }
  }
  *provided = required;
  initialized = true;
  return MPI_SUCCESS;
}
int MPI_Initialized(int* flag) { return *flag = initialized, MPI_SUCCESS; }
int MPI_Finalize(void) { return finalized = true, MPI_SUCCESS; }
int MPI_Finalized(int* flag) { return *flag = finalized, MPI_SUCCESS; }
int MPI_Query_thread(int* provided) { return *provided = MPI_THREAD_MULTIPLE, MPI_SUCCESS; }
int MPI_Abort(MPI_Comm, int code) { std::_Exit(code); }
int MPI_Error_string(int code, char* text, int* len) {
  const char* what = code == MPI_ERR_RANK       ? "MPI_ERR_RANK: loom built without MPI has rank 0 alone"
                     : code == MPI_ERR_TRUNCATE ? "MPI_ERR_TRUNCATE: a message longer than its receive buffer"
                     : code == MPI_ERR_PENDING  ? "MPI_ERR_PENDING: a wait for a message one process never sends"
                     : code == MPI_ERR_OTHER    ? "MPI_ERR_OTHER: loom built without MPI runs as one process"
                                                : "MPI error";
  *len = std::snprintf(text, MPI_MAX_ERROR_STRING, "%s", what);
  return MPI_SUCCESS;
}

int MPI_Comm_rank(MPI_Comm, int* rank) { return *rank = 0, MPI_SUCCESS; }
int MPI_Comm_size(MPI_Comm, int* size) { return *size = 1, MPI_SUCCESS; }
int MPI_Comm_split(MPI_Comm, int color, int, MPI_Comm* out) {
  std::lock_guard<std::mutex> lock(mu);
  *out = color == MPI_UNDEFINED ? MPI_COMM_NULL : next_comm++;
  return MPI_SUCCESS;
}
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) { return MPI_Comm_split(comm, 0, 0, out); }
int MPI_Comm_free(MPI_Comm* comm) { return *comm = MPI_COMM_NULL, MPI_SUCCESS; }
int MPI_Comm_set_errhandler(MPI_Comm, MPI_Errhandler) { return MPI_SUCCESS; }
int MPI_Comm_set_name(MPI_Comm, const char*) { return MPI_SUCCESS; }

int MPI_Barrier(MPI_Comm) { return MPI_SUCCESS; }
int MPI_Ibarrier(MPI_Comm, MPI_Request* request) { return *request = MPI_REQUEST_NULL, MPI_SUCCESS; }
int MPI_Bcast(void*, int, MPI_Datatype, int root, MPI_Comm) { return one_rank(root); }
int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op, MPI_Comm) {
  copy(send, recv, count, type);  // the sum, max or maxloc over one rank: its own values
  return MPI_SUCCESS;
}
int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return MPI_Allreduce(send, recv, count, type, op, comm);
}
int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int, MPI_Datatype,
                  MPI_Comm) {
  copy(send, recv, send_count, send_type);
  return MPI_SUCCESS;
}
int MPI_Reduce_scatter_block(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op, MPI_Comm) {
  copy(send, recv, count, type);
  return MPI_SUCCESS;
}
int MPI_Alltoallv(const void* send, const int* send_counts, const int* send_offsets, MPI_Datatype send_type,
                  void* recv, const int*, const int* recv_offsets, MPI_Datatype recv_type, MPI_Comm) {
  if (send != MPI_IN_PLACE)
    copy(static_cast<const char*>(send) + size_t(send_offsets[0]) * size_t(send_type),
         static_cast<char*>(recv) + size_t(recv_offsets[0]) * size_t(recv_type), send_counts[0], send_type);
  return MPI_SUCCESS;
}

int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;  // buffered: the send is done once its bytes are copied
  if (dest != 0) return MPI_ERR_RANK;
  const int n = count * type;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = posted.begin(); it != posted.end(); ++it)
    if (matches(**it, comm, tag)) {
      loom_mpi_request* recv = *it;
      posted.erase(it);
      return deliver(*recv, buf, n, tag);
    }
  auto msg = std::make_unique<loom_mpi_request>();
  msg->comm = comm;
  msg->tag = tag;
  msg->bytes.assign(static_cast<const unsigned char*>(buf), static_cast<const unsigned char*>(buf) + n);
  unexpected.push_back(std::move(msg));
  return MPI_SUCCESS;
}
int MPI_Send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
  MPI_Request request;
  return MPI_Isend(buf, count, type, dest, tag, comm, &request);
}
int MPI_Irecv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Request* request) {
  if (one_rank(source) != MPI_SUCCESS) return *request = MPI_REQUEST_NULL, MPI_ERR_RANK;
  auto* recv = new loom_mpi_request;
  recv->receive = true;
  recv->comm = comm;
  recv->tag = tag;
  recv->buf = buf;
  recv->capacity_bytes = count * type;
  *request = recv;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = unexpected.begin(); it != unexpected.end(); ++it)
    if (matches(*recv, (*it)->comm, (*it)->tag)) {
      const std::unique_ptr<loom_mpi_request> msg = std::move(*it);
      unexpected.erase(it);
      deliver(*recv, msg->bytes.data(), int(msg->bytes.size()), msg->tag);
      return MPI_SUCCESS;
    }
  posted.push_back(recv);
  return MPI_SUCCESS;
}
int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  std::lock_guard<std::mutex> lock(mu);
  loom_mpi_request* r = *request;
  *flag = r == MPI_REQUEST_NULL || r->done;
  if (r == MPI_REQUEST_NULL || !r->done) return MPI_SUCCESS;
  if (status != MPI_STATUS_IGNORE) *status = r->status;
  const int err = r->cancelled ? MPI_SUCCESS : r->status.MPI_ERROR;
  delete r;
  *request = MPI_REQUEST_NULL;
  return err;
}
int MPI_Recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status) {
  MPI_Request request;
  const int err = MPI_Irecv(buf, count, type, source, tag, comm, &request);
  return err != MPI_SUCCESS ? err : MPI_Wait(&request, status);
}
int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  int done = 0;
  const int err = MPI_Test(request, &done, status);
  return done ? err : MPI_ERR_PENDING;  // nothing else will ever send: waiting would hang
}
int MPI_Cancel(MPI_Request* request) {
  std::lock_guard<std::mutex> lock(mu);
  loom_mpi_request* r = *request;
  if (r == MPI_REQUEST_NULL || r->done) return MPI_SUCCESS;
  posted.remove(r);
  r->done = r->cancelled = true;
  return MPI_SUCCESS;
}
int MPI_Request_free(MPI_Request* request) {
  std::lock_guard<std::mutex> lock(mu);
  if (*request != MPI_REQUEST_NULL) {
    posted.remove(*request);
    delete *request;
  }
  *request = MPI_REQUEST_NULL;
  return MPI_SUCCESS;
}
int MPI_Get_count(const MPI_Status* status, MPI_Datatype type, int* count) {
  *count = status->count_bytes / type;
  return MPI_SUCCESS;
}

}  // extern "C"
