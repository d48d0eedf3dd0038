// The GPT-2 shape table: which units a model has and which parameters (names,
// shapes, weight-decay flags) each holds. Shared by the engine and by the
// coordinator, which publishes ownership maps without running the model.
//
// Units: 0 = "embed" (wte, wpe), 1..n_layer = "h.<i>" (one block each),
// n_layer + 1 = "head" (ln_f; lm_head is tied to wte).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "common/shard_layout.h"

namespace shardline::gpt {

int NumUnits(const ModelConfig& m);
std::string UnitName(const ModelConfig& m, int unit);
bool IsBlock(const ModelConfig& m, int unit);
int HeadUnit(const ModelConfig& m);
std::vector<ParamSpec> UnitParams(const ModelConfig& m, int unit);
int64_t NumParams(const ModelConfig& m);  // unique parameters (wte counted once)

// Training FLOPs per token, forward and backward (PaLM appendix B, as nanoGPT's
// estimate_mfu): 6N + 12*L*H*Q*T, with N the parameters less the position
// embedding (a lookup, not a matmul; the tied wte is the lm_head's matmul),
// L layers, H heads of size Q, and T the sequence length.
double TrainingFlopsPerToken(const ModelConfig& m);

// The ownership map: every unit's layout for shard group size `group_size`.
absl::StatusOr<std::vector<ShardLayout>> OwnershipMap(const ModelConfig& m, int group_size);

}  // namespace shardline::gpt
