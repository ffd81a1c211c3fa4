// A slow disk, on purpose (LD_PRELOAD): fsync of a file whose path contains
// LOOM_TEST_SLOW_FSYNC_PATH sleeps LOOM_TEST_SLOW_FSYNC_S seconds first, on
// world rank 0 only (OMPI_COMM_WORLD_RANK). Stands for what was measured on a
// host whose other jobs were writing: a checkpoint manifest's fsync held 14
// and 24 s (ext4 commits the journal, and with it the others' dirty data).
// issue 52's hang: the ranks done with the save wait in the export's gather
// while rank 0 writes, and the collective watchdog took that wait for a hang.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" int fsync(int fd) {
  using Fsync = int (*)(int);
  static Fsync real_fsync = reinterpret_cast<Fsync>(dlsym(RTLD_NEXT, "fsync"));
  const char *rank = getenv("OMPI_COMM_WORLD_RANK"), *seconds = getenv("LOOM_TEST_SLOW_FSYNC_S"),
             *match = getenv("LOOM_TEST_SLOW_FSYNC_PATH");
  if (rank && strcmp(rank, "0") == 0 && seconds && match) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    if (n > 0) {
      path[n] = 0;
      if (strstr(path, match)) sleep((unsigned)atoi(seconds));
    }
  }
  return real_fsync(fd);
}
