// One process's MPI: the part of MPI's C API that loom calls, for a world of
// exactly one rank, so that loom builds and runs without an MPI library
// (cmake -DLOOM_MPI=OFF). PETSc's MPIUNI and mpi-serial do the same; this is
// loom's, reduced to what it uses. For a machine that has no MPI at all: the
// GPU machine's image (tests/cuda/build_on_device.sh, issue 43's plan B),
// where the single-GPU tests and `train_gpt --device cuda` need no mpirun.
//
// With one rank a collective is a copy from send to receive buffer (or
// nothing, in place), a split gives a communicator of one, and a message is
// sent to oneself: kept until a receive with its tag takes it. Asking for
// another rank is an error (MPI_ERR_RANK), as is running under mpirun with
// more processes than one (MPI_Init_thread refuses).
#pragma once

#include <cstddef>

typedef int MPI_Comm;
typedef int MPI_Datatype;  // its size in bytes (MPI_2INT: 8)
typedef int MPI_Op;
typedef int MPI_Errhandler;
typedef struct loom_mpi_request* MPI_Request;  // a message sent or a receive posted; null: done

typedef struct {
  int MPI_SOURCE, MPI_TAG, MPI_ERROR;
  int count_bytes;  // for MPI_Get_count
} MPI_Status;

#define MPI_SUCCESS 0
#define MPI_ERR_RANK 6
#define MPI_ERR_TRUNCATE 15
#define MPI_ERR_OTHER 16
#define MPI_ERR_PENDING 18
#define MPI_MAX_ERROR_STRING 256
#define MPI_UNDEFINED (-32766)
#define MPI_ANY_SOURCE (-1)
#define MPI_ANY_TAG (-1)

#define MPI_COMM_NULL 0
#define MPI_COMM_WORLD 1
#define MPI_REQUEST_NULL ((MPI_Request)0)
#define MPI_STATUS_IGNORE ((MPI_Status*)0)
#define MPI_IN_PLACE ((void*)1)
#define MPI_ERRORS_RETURN 1

#define MPI_CHAR 1
#define MPI_UINT16_T 2
#define MPI_INT 4
#define MPI_INT32_T 4
#define MPI_FLOAT 4
#define MPI_INT64_T 8
#define MPI_DOUBLE 8
#define MPI_2INT 8

#define MPI_SUM 1
#define MPI_MAX 2
#define MPI_MAXLOC 3

#define MPI_THREAD_SINGLE 0
#define MPI_THREAD_MULTIPLE 3

#ifdef __cplusplus
extern "C" {
#endif

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided);
int MPI_Initialized(int* flag);
int MPI_Finalize(void);
int MPI_Finalized(int* flag);
int MPI_Query_thread(int* provided);
int MPI_Abort(MPI_Comm comm, int code);
int MPI_Error_string(int code, char* text, int* len);

int MPI_Comm_rank(MPI_Comm comm, int* rank);
int MPI_Comm_size(MPI_Comm comm, int* size);
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* out);
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out);
int MPI_Comm_free(MPI_Comm* comm);
int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler handler);
int MPI_Comm_set_name(MPI_Comm comm, const char* name);

int MPI_Barrier(MPI_Comm comm);
int MPI_Ibarrier(MPI_Comm comm, MPI_Request* request);
int MPI_Bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm);
int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);
int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request);
int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                  MPI_Datatype recv_type, MPI_Comm comm);
int MPI_Reduce_scatter_block(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);
int MPI_Alltoallv(const void* send, const int* send_counts, const int* send_offsets, MPI_Datatype send_type,
                  void* recv, const int* recv_counts, const int* recv_offsets, MPI_Datatype recv_type, MPI_Comm comm);

int MPI_Send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm);
int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request* request);
int MPI_Recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status);
int MPI_Irecv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Request* request);
int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status);
int MPI_Wait(MPI_Request* request, MPI_Status* status);
int MPI_Cancel(MPI_Request* request);
int MPI_Request_free(MPI_Request* request);
int MPI_Get_count(const MPI_Status* status, MPI_Datatype type, int* count);

#ifdef __cplusplus
}
#endif
