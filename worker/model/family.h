// ModelFamily: what the engine runs for one model family, as functions over
// each unit's weight views (so that every unit runs from its own flat
// buffer). The shapes and names of the units are common/model/model_shapes.h.
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
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/job/job_config.h"
#include "common/model/shard_layout.h"
#include "worker/model/document_attention.h"
#include "worker/model/seeded_init.h"

namespace shardline {

// Weight views of one unit, in model::UnitParams order.
using Weights = std::vector<at::Tensor>;

// LoRA's adapter of one projection: lora_A [rank, in], lora_B [out, rank].
struct LoraPair {
  at::Tensor a, b;
};

// One block's weights as a family computes with them: the base parameters
// and, under LoRA, the adapters of the adapted projections (lora[i] belongs
// to base[i]; empty, or undefined tensors, where none).
struct BlockWeights {
  BlockWeights(Weights w) : base(std::move(w)) {}  // NOLINT: a block without adapters
  Weights base;
  std::vector<LoraPair> lora;
  double lora_scaling = 0;
  const at::Tensor& operator[](size_t i) const { return base[i]; }
  // x base[i]^T + bias, and where base[i] is adapted PEFT's lora.Linear term
  // (x A^T) B^T * scaling added to it, in that order.
  at::Tensor Linear(const at::Tensor& x, size_t i, const at::Tensor& bias = {}) const;
};

// Documents packed into the sequences of a batch (TokenDataset's document
// starts): each token's position in its document, [B, T] int64 on the
// compute device, and the attention it allows, [B, 1, T, T] bool (a query
// attends the keys of its own document up to itself). Undefined members: one
// document per sequence (positions 0..T-1, causal attention).
struct Packing {
  at::Tensor positions;     // [B, T] on the compute device
  DocumentSpans documents;  // each sequence's documents, for DocumentAttention
  bool packed() const { return positions.defined(); }
  // A document begins wherever a position is 0; `host_positions` [B, T] on
  // the host, `positions` the same on the device.
  static Packing FromPositions(const at::Tensor& host_positions, const at::Tensor& positions);
};

// Causal attention of a block: over the whole sequence, or (packed) over
// each document alone.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Packing& packing,
                           std::optional<double> scale = std::nullopt);

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;

  // How a parameter starts when the job reads no weights (SeededUnitValues
  // draws the values).
  virtual ParamInit InitOf(const ParamSpec& p) const = 0;
  // Hidden states [B, T, C] of token ids [B, T].
  virtual at::Tensor Embed(const at::Tensor& idx, const Weights& embed, const Packing& packing) const = 0;
  virtual at::Tensor Block(const at::Tensor& x, const BlockWeights& block, const Packing& packing) const = 0;
  // The head is HeadHidden (the final norm of the last hidden state) times
  // HeadWeight^T ([vocab, C]; `embed` is the embed unit's weights, which a
  // tied head multiplies with).
  virtual at::Tensor HeadHidden(const at::Tensor& x, const Weights& head) const = 0;
  virtual const at::Tensor& HeadWeight(const Weights& head, const Weights& embed) const = 0;

  // Logits [B, T, vocab] from the last hidden state.
  at::Tensor HeadLogits(const at::Tensor& x, const Weights& head, const Weights& embed) const;
  // Sum of the token cross-entropies, times `loss_scale` (1 / tokens of the
  // global batch), computed in fp32 whatever the compute dtype, by
  // LinearCrossEntropy: the logits are never held whole.
  at::Tensor HeadLoss(const at::Tensor& x, const Weights& head, const Weights& embed, const at::Tensor& targets,
                      double loss_scale) const;
};

// The family of `m` (ValidateJobConfig has accepted its name), computing its
// cheap ops again in backward or keeping their outputs ([memory]
// recompute_cheap_ops).
std::unique_ptr<ModelFamily> MakeModelFamily(const ModelConfig& m, bool recompute_cheap_ops);

}  // namespace shardline
