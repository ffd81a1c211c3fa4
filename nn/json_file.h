// A JSON file of a model folder (config.json, model.safetensors.index.json),
// read whole. Internal to nn/: errors name the reader (`who`) and the file.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tensor/error.h"

namespace loom::nn {

inline nlohmann::ordered_json read_json_file(const std::string& path, const char* who) {
  std::ifstream in(path);
  LOOM_CHECK(in, who, ": cannot open ", path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {  // a parse_error, or out_of_range 406: a number no type holds (1e309)
    throw Error(str(who, ": ", path, ": not valid JSON: ", e.what()));
  }
}

}  // namespace loom::nn
