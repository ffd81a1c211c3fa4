// loom::Error: every failure is an exception whose message names the op and
// the shapes/dtypes involved ("matmul: [4, 8] @ [7, 3]: inner dimensions 8 and
// 7 differ"), never an abort or silent undefined behaviour.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// "[4, 8]"
inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) os << shape_str(v);
  else os << v;
  append(os, rest...);
}
}  // namespace detail

// Concatenates its arguments (shapes print as [a, b]) into one message.
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace loom

// LOOM_CHECK(cond, "op: ", shape, " ...") throws loom::Error with the message.
#define LOOM_CHECK(cond, ...)                          \
  do {                                                 \
    if (!(cond)) throw ::loom::Error(::loom::str(__VA_ARGS__)); \
  } while (0)
