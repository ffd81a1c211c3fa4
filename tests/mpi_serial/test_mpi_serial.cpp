// One process's MPI (parallel/comm/mpi_serial, the LOOM_MPI=OFF build):
// linked alone here, not beside a real MPI, whose symbols it shares.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "mpi.h"

namespace {

TEST(MpiSerial, AWorldOfOneWhoseCollectivesCopyAndWhoseSplitsGiveNewCommunicators) {
  int provided = 0, rank = -1, size = -1;
  ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), MPI_SUCCESS);
  EXPECT_EQ(provided, MPI_THREAD_MULTIPLE);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  const std::vector<float> x = {1.5f, -2.0f, 3.25f};
  std::vector<float> y(3, 0.0f), z(3, 0.0f);
  ASSERT_EQ(MPI_Allreduce(x.data(), y.data(), 3, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
  EXPECT_EQ(y, x);
  ASSERT_EQ(MPI_Allgather(x.data(), 3, MPI_FLOAT, z.data(), 3, MPI_FLOAT, MPI_COMM_WORLD), MPI_SUCCESS);
  EXPECT_EQ(z, x);
  std::vector<double> send = {7.0, 8.0, 9.0}, recv(3, 0.0);
  const int counts[1] = {2}, send_offsets[1] = {1}, recv_offsets[1] = {0};
  MPI_Alltoallv(send.data(), counts, send_offsets, MPI_DOUBLE, recv.data(), counts, recv_offsets, MPI_DOUBLE,
                MPI_COMM_WORLD);
  EXPECT_EQ(recv, (std::vector<double>{8.0, 9.0, 0.0}));
  MPI_Comm a = MPI_COMM_NULL, b = MPI_COMM_NULL, none = MPI_COMM_WORLD;
  MPI_Comm_split(MPI_COMM_WORLD, 0, 0, &a);
  MPI_Comm_dup(MPI_COMM_WORLD, &b);
  MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, 0, &none);
  EXPECT_NE(a, MPI_COMM_WORLD);
  EXPECT_NE(a, b);
  EXPECT_EQ(none, MPI_COMM_NULL);
  int root_elsewhere = 0;
  EXPECT_EQ(MPI_Bcast(&root_elsewhere, 1, MPI_INT, 1, MPI_COMM_WORLD), MPI_ERR_RANK);
}

TEST(MpiSerial, AMessageToOneselfWaitsForTheReceiveWithItsCommunicatorAndTag) {
  MPI_Comm other = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &other);
  const int sent[2] = {11, 12}, sent_other = 99;
  MPI_Request s1, s2;
  ASSERT_EQ(MPI_Isend(sent, 2, MPI_INT, 0, /*tag=*/5, MPI_COMM_WORLD, &s1), MPI_SUCCESS);
  ASSERT_EQ(MPI_Isend(&sent_other, 1, MPI_INT, 0, 5, other, &s2), MPI_SUCCESS);
  EXPECT_EQ(s1, MPI_REQUEST_NULL);  // buffered: done once copied
  int got = 0, flag = 0;
  MPI_Request r;
  MPI_Status status;
  ASSERT_EQ(MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, 5, other, &r), MPI_SUCCESS);  // the other communicator's
  ASSERT_EQ(MPI_Test(&r, &flag, &status), MPI_SUCCESS);
  EXPECT_EQ(flag, 1);
  EXPECT_EQ(got, 99);
  int two[2] = {0, 0}, count = -1;
  ASSERT_EQ(MPI_Irecv(two, 2, MPI_INT, 0, 4, MPI_COMM_WORLD, &r), MPI_SUCCESS);  // tag 4: nothing yet
  MPI_Test(&r, &flag, &status);
  EXPECT_EQ(flag, 0);
  const int late[2] = {21, 22};
  MPI_Send(late, 2, MPI_INT, 0, 4, MPI_COMM_WORLD);  // now it arrives
  MPI_Test(&r, &flag, &status);
  EXPECT_EQ(flag, 1);
  MPI_Get_count(&status, MPI_INT, &count);
  EXPECT_EQ(count, 2);
  EXPECT_EQ(two[1], 22);
  ASSERT_EQ(MPI_Recv(two, 2, MPI_INT, 0, 5, MPI_COMM_WORLD, &status), MPI_SUCCESS);  // the first send, still kept
  EXPECT_EQ(two[0], 11);
  EXPECT_EQ(status.MPI_TAG, 5);
  EXPECT_EQ(MPI_Isend(sent, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, &s1), MPI_ERR_RANK);
}

TEST(MpiSerial, AWaitNoSendCanEndIsAnErrorAndACancelledReceiveIsDone) {
  int never = 0, flag = 0;
  MPI_Request r;
  MPI_Irecv(&never, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, &r);
  EXPECT_EQ(MPI_Wait(&r, MPI_STATUS_IGNORE), MPI_ERR_PENDING);  // instead of hanging
  MPI_Cancel(&r);
  EXPECT_EQ(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), MPI_SUCCESS);
  EXPECT_EQ(flag, 1);
  EXPECT_EQ(r, MPI_REQUEST_NULL);
  const int late = 5;
  MPI_Send(&late, 1, MPI_INT, 0, 77, MPI_COMM_WORLD);  // the cancelled receive does not take it
  EXPECT_EQ(never, 0);
  char small[2];
  const char big[4] = {'a', 'b', 'c', 'd'};
  MPI_Irecv(small, 2, MPI_CHAR, 0, 78, MPI_COMM_WORLD, &r);
  MPI_Send(big, 4, MPI_CHAR, 0, 78, MPI_COMM_WORLD);
  EXPECT_EQ(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), MPI_ERR_TRUNCATE);
}

TEST(MpiSerial, StartedByMpirunWithMoreRanksItRefusesInsteadOfTrainingAlone) {
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  int provided = 0;
  EXPECT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), MPI_ERR_OTHER);
  unsetenv("OMPI_COMM_WORLD_SIZE");
}

}  // namespace
