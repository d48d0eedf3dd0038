// The shape tables of the model families: which units a model has and which
// parameters (names, shapes, weight-decay flags) each holds. Shared by the
// engine and by the coordinator, which publishes ownership maps without
// running the model. Every function dispatches on ModelConfig::family.
//
// gpt2 (nanoGPT's names): 0 = "embed" (wte, wpe), 1..n_layer = "h.<i>" (one
// block each), n_layer + 1 = "head" (ln_f; lm_head is tied to wte).
// llama (transformers' names): 0 = "embed" (model.embed_tokens),
// 1..n_layer = "layers.<i>" (input_layernorm, q/k/v/o_proj with optional
// q/k/v biases, optional q_norm/k_norm, post_attention_layernorm,
// gate/up/down_proj), n_layer + 1 = "head" (model.norm, and lm_head unless
// the embeddings are tied).
// Weight decay applies to tensors of two or more dimensions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "common/shard_layout.h"

namespace shardline::model {

int NumUnits(const ModelConfig& m);
std::string UnitName(const ModelConfig& m, int unit);
bool IsBlock(const ModelConfig& m, int unit);
int HeadUnit(const ModelConfig& m);
std::vector<ParamSpec> UnitParams(const ModelConfig& m, int unit);
int64_t NumParams(const ModelConfig& m);  // unique parameters (wte counted once)

// Training FLOPs per token, forward and backward (PaLM appendix B, as nanoGPT's
// estimate_mfu): 6N + 12*L*H*Q*T, with N the parameters less the lookups
// that are no matmul (gpt2's position embedding; llama's token embedding
// unless it is tied to the lm_head), L layers, H heads of size Q, and T the
// sequence length.
double TrainingFlopsPerToken(const ModelConfig& m);

// The ownership map: every unit's layout for shard group size `group_size`.
absl::StatusOr<std::vector<ShardLayout>> OwnershipMap(const ModelConfig& m, int group_size);

}  // namespace shardline::model
