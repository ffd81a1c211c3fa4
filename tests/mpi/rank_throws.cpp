// A deliberately failing program: rank 1 throws while the others wait in a
// barrier. The whole job must exit non-zero within seconds, naming the rank
// and the message, whether the exception reaches loom::parallel::run()
// (`rank_throws run`) or escapes main() to std::terminate (`rank_throws terminate`).
#include <cstring>

#include "parallel/comm/distributed.h"

using namespace loom;

static int body() {
  parallel::ProcessGroup& world = parallel::world();
  if (world.rank() == 1) throw Error("rank 1 failed on purpose");
  world.barrier();  // the others would wait here forever
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "terminate") == 0) {
    parallel::init(argc, argv);
    body();
    parallel::finalize();
    return 0;
  }
  return parallel::run(argc, argv, body);
}
