// error_of(f): the message of the loom::Error that f throws, or "(no error)".
// Tests check error messages with it: EXPECT_NE(error_of(f).find("..."), npos).
#pragma once

#include <functional>
#include <string>

#include "tensor/error.h"

namespace loom::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace loom::test
