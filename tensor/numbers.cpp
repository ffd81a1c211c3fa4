#include "tensor/numbers.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "tensor/error.h"

namespace loom {

namespace {

bool all_digits(const std::string& s, size_t from) {
  if (from >= s.size()) return false;
  for (size_t i = from; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

// Shortest text that reads back as v: "0.01", "1e+30", "1099511627776".
template <class T>
std::string show(T v) {
  std::ostringstream os;
  if constexpr (std::is_floating_point_v<T>) os.precision(std::numeric_limits<T>::max_digits10 - 2);
  os << v;
  return os.str();
}

}  // namespace

std::optional<int64_t> read_int64(const std::string& text) {
  if (!all_digits(text, text.starts_with("-") ? 1 : 0)) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || end != text.c_str() + text.size()) return std::nullopt;
  return int64_t(v);
}

std::optional<uint64_t> read_uint64(const std::string& text) {
  if (!all_digits(text, 0)) return std::nullopt;  // strtoull would read "-1" as 2^64 - 1
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno == ERANGE || end != text.c_str() + text.size()) return std::nullopt;
  return uint64_t(v);
}

std::optional<double> read_double(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  // ERANGE: past double's range (1e400), or so small that it lost its digits (1e-400).
  if (errno == ERANGE || end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

std::string number_error(const std::string& name, const std::string& text, const char* kind, const std::string& range,
                         const std::string& note) {
  return str(name, " must be ", kind, " in ", range, note, ", got '", text, "'");
}

template <class T>
T parse_number(const std::string& text, const std::string& name, const NumberRange<T>& r) {
  std::optional<T> v;
  if constexpr (std::is_floating_point_v<T>) {
    v = read_double(text);
  } else if constexpr (std::is_signed_v<T>) {
    std::optional<int64_t> w = read_int64(text);
    if (w && *w >= int64_t(std::numeric_limits<T>::min()) && *w <= int64_t(std::numeric_limits<T>::max())) v = T(*w);
  } else {
    v = read_uint64(text);
  }
  // (nan fails both comparisons, so it is out of every range.)
  const bool in_range = v && (r.lo_open ? *v > r.lo : *v >= r.lo) && *v <= r.hi;
  LOOM_CHECK(in_range, number_error(name, text, std::is_floating_point_v<T> ? "a number" : "an integer",
                                    str(r.lo_open ? "(" : "[", show(r.lo), ", ", show(r.hi), "]"), r.note));
  return *v;
}

template int parse_number<int>(const std::string&, const std::string&, const NumberRange<int>&);
template int64_t parse_number<int64_t>(const std::string&, const std::string&, const NumberRange<int64_t>&);
template uint64_t parse_number<uint64_t>(const std::string&, const std::string&, const NumberRange<uint64_t>&);
template double parse_number<double>(const std::string&, const std::string&, const NumberRange<double>&);

double env_number(const char* name, double fallback, const NumberRange<double>& range) {
  const char* s = std::getenv(name);
  return s ? parse_number<double>(s, name, range) : fallback;
}

}  // namespace loom
