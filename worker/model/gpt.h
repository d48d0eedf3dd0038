// GPT-2 as nanoGPT's model.py defines it, written as functions over weight
// views so that each unit can run from its own flat buffer.
//
// Units and their parameters are common/model_shapes.h. The lm_head is tied
// to wte, so the head unit reads the embed unit's wte view;
// the engine keeps the embed unit unsharded for the whole step (as FSDP does
// with the root module's parameters).
//
// Numerics: pre-LayerNorm blocks with biases (eps 1e-5), fused c_attn (q, k, v
// in that order), causal scaled-dot-product attention, 4x MLP with the tanh
// GELU, no dropout. Loss = sum of token cross-entropies times `loss_scale`
// (1 / tokens of the global batch), computed in fp32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/job_config.h"
#include "common/model_shapes.h"
#include "common/shard_layout.h"

namespace shardline::gpt {

// Writes the initial values of `unit` into `flat` (fp32, layout.padded_numel,
// padding left zero). A function of (seed, parameter name) alone: never of
// world size or rank. nanoGPT's scheme: N(0, 0.02), residual projections
// N(0, 0.02/sqrt(2 n_layer)), zero biases, unit LayerNorm weights.
void InitUnit(const ModelConfig& m, const ShardLayout& layout, uint64_t seed, at::Tensor flat);

// Weight views of one unit, in UnitParams order.
using Weights = std::vector<at::Tensor>;

at::Tensor EmbedForward(const at::Tensor& idx, const Weights& embed);
at::Tensor BlockForward(const at::Tensor& x, const Weights& block, int n_head);
// Logits [B, T, vocab] from the final hidden state (ln_f, then x @ wte^T).
at::Tensor HeadLogits(const at::Tensor& x, const Weights& head, const at::Tensor& wte);
// Sum of cross-entropies over every token, times loss_scale (fp32 scalar).
at::Tensor HeadLoss(const at::Tensor& x, const Weights& head, const at::Tensor& wte,
                    const at::Tensor& targets, double loss_scale);

// FLOPs of one forward+backward per token, PaLM's 6N + 12 L H Q T (N without
// the position embedding).
double FlopsPerToken(const ModelConfig& m);

}  // namespace shardline::gpt
