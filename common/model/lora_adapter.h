// PEFT adapter directories, as peft's PeftModel.save_pretrained writes and
// from_pretrained reads them: adapter_config.json (a LoraConfig) and
// adapter_model.safetensors, whose tensors are the engine's adapter names
// (model::AdapterParams) under the prefix "base_model.model.".
//
// Supported: peft_type LORA with one rank and alpha for every module
// (rank_pattern and alpha_pattern empty), no bias, no rsLoRA, no DoRA, no
// modules_to_save and no layers_to_transform; anything else is refused,
// naming the key.
//
// Threading: pure functions. Errors are one line naming the file and key.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/job/job_config.h"

namespace shardline {

// The tensor name PEFT saves an engine adapter parameter under.
std::string PeftTensorName(const std::string& engine_name);

// When [lora] init_from is set: reads its adapter_config.json (init_from as
// given: ResolveJobSpec has made it absolute). Its r,
// lora_alpha and target_modules fill the [lora] keys the job file left out;
// one the job file set to something else is an error naming both.
// (lora_dropout is a training choice, not the adapter's: it is not taken.)
absl::Status ApplyPeftConfig(JobConfig& c, const std::string& source);

// adapter_config.json for adapters of `m` as `l` describes them, for the base
// model at `base_model` (a path or hub id; may be empty).
std::string PeftAdapterConfigJson(const ModelConfig& m, const LoraConfig& l, const std::string& base_model);

}  // namespace shardline
