// Hugging Face model directories, as transformers' save_pretrained writes
// them: config.json read into [model] and written from it, and how tensors
// are named and laid out there compared with the engine.
//
// Supported: model_type gpt2 (GPT2LMHeadModel) as family "gpt2"; llama,
// mistral, qwen2 and qwen3 (*ForCausalLM) as family "llama". Anything whose
// numerics the engine does not compute is refused, naming the config key:
// another model_type (MoE ones included), rope types other than default and
// llama3, an o_proj or MLP bias, an activation other than the family's, and a
// sliding window shorter than the training sequence (one at least as long
// changes nothing). Tensor names are transformers' for both families; GPT-2
// stores its four Conv1D weights as [in, out], the transpose of the engine's
// [out, in], and its position table for n_positions rows, of which the
// engine uses the first block_size.
//
// Threading: pure functions. Errors are one line naming the file and key.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job/job_config.h"

namespace shardline {

// When [model] hf_dir is set: fills the model's sizes from its config.json
// (hf_dir as given: ResolveJobSpec has made it absolute). A [model] key the job file set that contradicts config.json is
// an error naming both; block_size, the training sequence length, defaults to
// min(256, max_position_embeddings) and may not exceed it. Nothing to do
// without hf_dir.
absl::Status ApplyHfConfig(JobConfig& c, const std::string& source);

// Whether transformers stores the engine parameter `name` transposed
// (GPT-2's Conv1D weights).
bool HfStoredTransposed(const ModelConfig& m, const std::string& name);

// The bos_token_id, eos_token_id and pad_token_id that `object` (a
// config.json, or a manifest's record of one) sets, as ModelConfig's
// special_token_ids: each an id, a list of at most 64 ids, or null; another
// value is an error naming `file` and the key.
absl::StatusOr<std::string> SpecialTokenIds(const nlohmann::json& object, const std::string& file);

// The config.json text for `m` with weights stored as `torch_dtype`
// ("float32" or "bfloat16"): the architecture is Qwen3 for per-head q/k
// norms, Qwen2 for q/k/v biases, Llama otherwise (Mistral without a sliding
// window is the same computation), and GPT2LMHeadModel for gpt2.
std::string HfConfigJson(const ModelConfig& m, const std::string& torch_dtype);

}  // namespace shardline
