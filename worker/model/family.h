// ModelFamily: what the engine runs for one model family, as functions over
// each unit's weight views (so that every unit runs from its own flat
// buffer). The shapes and names of the units are common/model_shapes.h.
//
//   gpt2    nanoGPT's GPT-2 (worker/model/gpt.cc)
//   llama   Llama 2/3, Mistral, Qwen2, Qwen3 as transformers' modelling code
//           computes them (worker/model/llama.cc)
//
// The engine keeps the embed unit gathered for the whole step, so a head tied
// to the token embedding reads it there. Threading: immutable, any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/job_config.h"
#include "common/shard_layout.h"

namespace shardline {

// Weight views of one unit, in model::UnitParams order.
using Weights = std::vector<at::Tensor>;

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  // Writes the initial values of a unit into `flat` (fp32 on the host,
  // layout.padded_numel, padding left zero): a function of (seed, parameter
  // name) alone, never of world size or rank.
  virtual void InitUnit(const ShardLayout& layout, uint64_t seed, at::Tensor flat) const = 0;
  // Hidden states [B, T, C] of token ids [B, T].
  virtual at::Tensor Embed(const at::Tensor& idx, const Weights& embed) const = 0;
  virtual at::Tensor Block(const at::Tensor& x, const Weights& block) const = 0;
  // Logits [B, T, vocab] from the last hidden state; `embed` is the embed
  // unit's weights, which a tied head multiplies with.
  virtual at::Tensor HeadLogits(const at::Tensor& x, const Weights& head, const Weights& embed) const = 0;

  // Sum of the token cross-entropies, times `loss_scale` (1 / tokens of the
  // global batch), computed in fp32 whatever the compute dtype.
  at::Tensor HeadLoss(const at::Tensor& x, const Weights& head, const Weights& embed, const at::Tensor& targets,
                      double loss_scale) const;
};

// The family of `m` (ValidateJobConfig has accepted its name).
std::unique_ptr<ModelFamily> MakeModelFamily(const ModelConfig& m);

// Fills `w` with N(0, std) from a generator seeded by (seed, name) alone, so
// values do not depend on which other tensors exist or on the order of init.
void SeededNormal(const std::string& name, uint64_t seed, double std, at::Tensor w);

}  // namespace shardline
