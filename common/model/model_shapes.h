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
#include "common/job/job_config.h"
#include "common/model/shard_layout.h"

namespace shardline::model {

int NumUnits(const ModelConfig& m);
std::string UnitName(const ModelConfig& m, int unit);
bool IsBlock(const ModelConfig& m, int unit);
int HeadUnit(const ModelConfig& m);
std::vector<ParamSpec> UnitParams(const ModelConfig& m, int unit);
// Unique parameters (wte counted once), exact; INT64_MAX when the count
// does not fit in int64 (only for a model no bound admits). Takes constant
// time whatever n_layer.
int64_t NumParams(const ModelConfig& m);
// The same count in double arithmetic: never overflows, exact below 2^53.
// What bounds checks on unvalidated models compare and report.
double ApproxNumParams(const ModelConfig& m);

// Training FLOPs per token, forward and backward (PaLM appendix B, as nanoGPT's
// estimate_mfu): 6N + 12*L*H*Q*T, with N the parameters less the lookups
// that are no matmul (gpt2's position embedding; llama's token embedding
// unless it is tied to the lm_head), L layers, H heads of size Q, and T the
// sequence length. Under LoRA (l.enabled) the frozen weights get no weight
// gradient: 4 FLOPs per frozen weight, 6 per adapter weight.
double TrainingFlopsPerToken(const ModelConfig& m, const LoraConfig& l = LoraConfig());

// One block's parameter count (its base weights, no adapters), in double as
// the FLOP figures built on it are.
double BlockParams(const ModelConfig& m);

// One block's share of TrainingFlopsPerToken: its matmuls (2 FLOPs per weight
// forward, 4 backward; 2 backward for a frozen weight under LoRA, plus 6 per
// adapter weight) and attention (12 H Q T, a third of it forward).
struct BlockFlops {
  double forward = 0, backward = 0;
};
BlockFlops BlockFlopsPerToken(const ModelConfig& m, const LoraConfig& l = LoraConfig());

// The ownership map: every unit's layout for shard group size `group_size`.
absl::StatusOr<std::vector<ShardLayout>> OwnershipMap(const ModelConfig& m, int group_size);

// Whether model unit `unit` keeps its optimizer state in pieces across
// `replicas` replicate groups (ParallelismConfig::shard_optimizer_across_replicas):
// hybrid_shard with more than one replica, except the table's and the head's
// units where the sparse embedding trains them over a shard group of
// `shard_group` > 1 ranks (their shard is all-reduced whole, never
// reduce-scattered, so there is nothing to cut). The engine's rule
// (Engine::InitUnit) and the planner's (common/plan/plan.cc).
bool OptimizerInPieces(const ParallelismConfig& p, const ModelConfig& m, int shard_group, int replicas, int unit);

// ---- LoRA ---------------------------------------------------------------
// Adapters sit on projections of the blocks only; each block unit's adapters
// form one trainable flat buffer of their own, the unit "<unit>.lora".

// One adapted projection of a unit.
struct LoraTarget {
  int base_index = 0;  // the projection weight's index in UnitParams(m, unit)
  std::string module;  // PEFT's module path: "model.layers.0.self_attn.q_proj"
  int64_t in = 0, out = 0;
};
// The family's projection module names, in block order.
std::vector<std::string> LoraModuleNames(const ModelConfig& m);
// What [lora] target_modules selects: as given, "all-linear" expanded, or
// (when empty) PEFT's default for the family: q_proj and v_proj; c_attn.
std::vector<std::string> LoraModules(const ModelConfig& m, const LoraConfig& l);
std::vector<LoraTarget> LoraTargets(const ModelConfig& m, const LoraConfig& l, int unit);
// Per target, "<module>.lora_A.weight" [rank, in] then "<module>.lora_B.weight" [out, rank].
std::vector<ParamSpec> AdapterParams(const ModelConfig& m, const LoraConfig& l, int unit);
int64_t NumAdapterParams(const ModelConfig& m, const LoraConfig& l);
// The model unit whose adapters trainable unit `i` holds (i indexes TrainableUnits).
std::vector<int> TrainableUnits(const ModelConfig& m, const LoraConfig& l);
// The layouts of what is trained, in order: every unit without LoRA, the
// "<unit>.lora" adapter units with it. Checkpoints hold exactly these.
absl::StatusOr<std::vector<ShardLayout>> TrainableOwnershipMap(const ModelConfig& m, const LoraConfig& l,
                                                               int group_size);

}  // namespace shardline::model
