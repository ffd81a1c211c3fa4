// Numbers read from text - train_gpt's flags, environment variables such as
// LOOM_COLLECTIVE_TIMEOUT, a checkpoint's metadata - by one strict parser: the
// whole text is the number, nothing is remapped, and every refusal has one
// shape naming what was read, the text and the allowed range:
//   --warmup must be an integer in [0, 1099511627776], got ''
//   --seed must be an integer in [0, 18446744073709551615], got '-1'
//   LOOM_COLLECTIVE_TIMEOUT must be a number in [1, 604800] (seconds), got '1e-9'
// (std::stoll("6x") reads 6, strtoull("-1") reads 2^64 - 1, and a CLI option
// given '' reads 0: each of those ran a different job from the one asked for.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

// The one parser: the number the whole text spells, or nothing. Integers are
// decimal ("-" allowed only where the type is signed), no sign "+", no spaces,
// in the type's range; a number is what strtod reads ("0.5", "1e-3", "nan",
// "inf"), again the whole text, never out of double's range.
std::optional<int64_t> read_int64(const std::string& text);
std::optional<uint64_t> read_uint64(const std::string& text);
std::optional<double> read_double(const std::string& text);

// The allowed values of one named number: [lo, hi], or (lo, hi] when
// lo_open, and a note that says what a value means ("(0: never)").
template <class T>
struct NumberRange {
  T lo, hi;
  std::string note = "";
  bool lo_open = false;
};

// "NAME must be an integer in [lo, hi]NOTE, got 'TEXT'": the one message shape.
std::string number_error(const std::string& name, const std::string& text, const char* kind, const std::string& range,
                         const std::string& note);

// Reads text and checks the range; throws loom::Error in the one shape.
// T: int, int64_t, uint64_t or double.
template <class T>
T parse_number(const std::string& text, const std::string& name, const NumberRange<T>& range);

// The environment variable `name` read by parse_number, or `fallback` when it
// is unset. Set but empty is an error, like any other text that is no number.
double env_number(const char* name, double fallback, const NumberRange<double>& range);

}  // namespace loom
