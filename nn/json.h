// A minimal JSON reader and string writer: just what safetensors headers hold
// (objects, arrays, strings, numbers; no true/false/null). Objects keep their
// members in file order, so a header's tensor order survives a load.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom::nn::json {

struct Json {
  enum Kind { String, Number, Array, Object } kind = String;
  std::string text;                                  // String: decoded value; Number: the literal
  std::vector<Json> items;                           // Array
  std::vector<std::pair<std::string, Json>> members;  // Object, in file order
};

// Parses one JSON value filling all of text (whitespace aside). Errors read
// "<context> at byte <n>: <what went wrong>".
Json parse(const std::string& text, const std::string& context);

// A JSON string literal: quotes, backslashes and control characters escaped;
// other bytes (UTF-8) written as they are.
std::string quote(const std::string& s);

}  // namespace loom::nn::json
