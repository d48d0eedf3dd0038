// JSON helpers.
//   ParseJsonObject: one JSON object parsed from a file's text, for the
//     readers of transformers' and PEFT's JSON files (config.json,
//     adapter_config.json). Errors name the file: malformed JSON, or JSON
//     that is not an object.
//   FiniteOrNull: a double as a JSON value that reads back exactly; JSON has no NaN or infinity, so one not finite is null.
#pragma once

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"

namespace shardline {

inline absl::StatusOr<nlohmann::json> ParseJsonObject(const std::string& text, const std::string& file) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": malformed JSON: ", Shown(e.what(), 256)));
  }
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  return j;
}

inline nlohmann::ordered_json FiniteOrNull(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

}  // namespace shardline
