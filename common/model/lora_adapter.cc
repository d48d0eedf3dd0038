#include "common/model/lora_adapter.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/json_object.h"
#include "common/base/quoted.h"
#include "common/model/model_shapes.h"

namespace shardline {

using nlohmann::json;

std::string PeftTensorName(const std::string& engine_name) { return "base_model.model." + engine_name; }

namespace {

// A key whose value must be absent, null, false, empty or equal to `ok`.
bool Unset(const json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return true;
  const json& v = j.at(key);
  return (v.is_boolean() && !v.get<bool>()) || ((v.is_object() || v.is_array() || v.is_string()) && v.empty());
}

absl::Status ReadAdapterConfig(const json& j, const std::string& file, const std::string& source, JobConfig& c) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", key, ": ", why, " (not supported)"));
  };
  // Every value is checked for its type before it is read: nlohmann's
  // value() and get() throw on another type, and nothing here may throw.
  const json peft_type = j.value("peft_type", json());
  if (!peft_type.is_string() || peft_type.get<std::string>() != "LORA") {
    return refuse("peft_type", absl::StrCat(Shown(peft_type.dump()), " is not LORA"));
  }
  for (const char* key : {"use_rslora", "use_dora", "modules_to_save", "layers_to_transform", "rank_pattern",
                          "alpha_pattern", "layers_pattern", "trainable_token_indices", "lora_bias", "exclude_modules",
                          "target_parameters", "layer_replication", "use_qalora", "alora_invocation_tokens"}) {
    if (!Unset(j, key)) return refuse(key, absl::StrCat("set to ", Shown(j.at(key).dump())));
  }
  if (j.contains("bias") && j.at("bias") != "none") return refuse("bias", Shown(j.at("bias").dump()));
  LoraConfig& l = c.lora;
  auto contradict = [&](const char* toml_key, const std::string& have, const char* peft_key, const std::string& want) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": [lora] ", toml_key, " = ", have, " contradicts ", file,
                                                   " ", peft_key, " = ", want));
  };
  if (!j.contains("r") || !j.at("r").is_number_integer() || j.at("r").get<int64_t>() < 1 ||
      j.at("r").get<int64_t>() > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": r must be an integer in [1, 65536]"));
  }
  const int r = j.at("r").get<int>();
  if (l.explicit_keys.count("rank") && l.rank != r) return contradict("rank", absl::StrCat(l.rank), "r", absl::StrCat(r));
  l.rank = r;
  if (!j.contains("lora_alpha") || !j.at("lora_alpha").is_number() || !(j.at("lora_alpha").get<double>() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": lora_alpha must be a number > 0"));
  }
  const double alpha = j.at("lora_alpha").get<double>();
  if (l.explicit_keys.count("alpha") && l.alpha != alpha) {
    return contradict("alpha", absl::StrCat(l.alpha), "lora_alpha", absl::StrCat(alpha));
  }
  l.alpha = alpha;
  // target_modules: a list of module names, or one name (PEFT also takes a
  // regex there, which is refused as an unknown name by validation).
  std::vector<std::string> targets;
  const json& t = j.value("target_modules", json());
  if (t.is_string()) {
    targets.push_back(t.get<std::string>());
  } else if (t.is_array()) {
    for (const json& x : t) {
      if (!x.is_string()) return absl::InvalidArgumentError(absl::StrCat(file, ": target_modules must hold strings"));
      targets.push_back(x.get<std::string>());
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(file, ": target_modules must be a string or a list of strings"));
  }
  std::sort(targets.begin(), targets.end());
  if (l.explicit_keys.count("target_modules")) {
    std::vector<std::string> mine = model::LoraModules(c.model, l);
    std::sort(mine.begin(), mine.end());
    std::vector<std::string> theirs = targets;
    if (theirs == std::vector<std::string>{"all-linear"}) theirs = model::LoraModuleNames(c.model);
    std::sort(theirs.begin(), theirs.end());
    if (mine != theirs) {
      return contradict("target_modules", absl::StrCat("[", absl::StrJoin(mine, ", "), "]"), "target_modules",
                        absl::StrCat("[", absl::StrJoin(targets, ", "), "]"));
    }
  }
  l.target_modules = targets;
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyPeftConfig(JobConfig& c, const std::string& source) {
  if (!c.lora.enabled || c.lora.init_from.empty()) return absl::OkStatus();
  const std::string file = c.lora.init_from + "/adapter_config.json";
  struct stat st;
  if (stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(source, ": [lora] init_from ", c.lora.init_from,
                                            ": no adapter_config.json (not a PEFT adapter directory)"));
  }
  absl::StatusOr<std::string> text = ReadFileToString(file, "[lora] init_from");
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat(source, ": ", text.status().message()));
  absl::StatusOr<json> j = ParseJsonObject(*text, file);
  if (!j.ok()) return j.status();
  return ReadAdapterConfig(*j, file, source, c);
}

std::string PeftAdapterConfigJson(const ModelConfig& m, const LoraConfig& l, const std::string& base_model) {
  std::vector<std::string> targets = model::LoraModules(m, l);
  std::sort(targets.begin(), targets.end());
  json j = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"base_model_name_or_path", base_model.empty() ? json() : json(base_model)},
            {"r", l.rank},
            {"lora_alpha", l.alpha},
            {"lora_dropout", l.dropout},
            {"target_modules", targets},
            {"bias", "none"},
            // GPT-2's Conv1D stores [in, out]; PEFT merges its adapters transposed.
            {"fan_in_fan_out", !m.is_llama()},
            {"use_rslora", false},
            {"use_dora", false},
            {"init_lora_weights", true},
            {"inference_mode", true},
            {"modules_to_save", json()},
            {"layers_to_transform", json()},
            {"rank_pattern", json::object()},
            {"alpha_pattern", json::object()}};
  return j.dump(2) + "\n";
}

}  // namespace shardline
