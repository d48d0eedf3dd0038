// Attention over packed documents: each document of a packed sequence
// attends causally within itself and to nothing else, computed as causal
// scaled-dot-product attention over each document alone, never through a
// [T, T] mask, so that its cost is the sum of the documents' own (what
// varlen kernels do with cumulative sequence lengths). Documents of one
// length across the micro-batch go through one causal SDPA call together.
//
// DocumentSpans is read once per micro-batch from the host positions (a
// document begins wherever a position is 0); DocumentAttention is autograd
// through ATen's own ops (narrow, stack, SDPA, cat), so activation
// checkpointing and LoRA see ordinary tensors. Threads: the caller's.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

namespace shardline {

struct DocumentSpans {
  // spans[b]: sequence b's documents as [start, length), in order, covering [0, T).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> spans;

  // From positions [B, T] (int64, on the host).
  static DocumentSpans FromPositions(const at::Tensor& host_positions);
};

// q [B, H, T, D], k and v [B, H, T, D] (key/value heads already repeated):
// each document's causal attention, as [B, H, T, D]; `scale` as SDPA's.
at::Tensor DocumentAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const DocumentSpans& docs,
                             std::optional<double> scale = std::nullopt);

}  // namespace shardline
