// printf on rank 0 only: the line each of train_gpt's helpers prints about what it built.
#pragma once

#include <cstdio>

namespace loom::train {

template <typename... Values>
void say(bool rank0, const char* fmt, Values... values) {
  if (rank0) std::printf(fmt, values...);
}

}  // namespace loom::train
