// AdamW with Adam's moments in 8 bits ([optimizer] moments_dtype = "8bit"):
// what bitsandbytes' AdamW8bit computes on the CPU (bitsandbytes 0.50,
// tests/unit/data/make_adamw_8bit.py records it), over one flat shard.
//
// Per parameter tensor, as common/model/moment_blocks.h cuts the shard:
//  - 8-bit (a tensor of at least 4096 elements): each step dequantizes both
//    moments (code[q] * absmax), runs bitsandbytes' update on them in fp32
//    (m = m * b1 + (1 - b1) g, v = v * b2 + (1 - b2) g^2, the decoupled decay,
//    p += -(lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)), then quantizes them
//    again: per block, absmax = max |x|; each x * (1 / absmax) to the code
//    its 16-bit cell ((x + 1) / 2 * 65535 + 1/2, truncated) maps to, the code
//    nearest that cell's centre. m uses the signed dynamic map, v the
//    unsigned one (bitsandbytes' create_dynamic_map);
//  - fp32 moments (a smaller tensor): bitsandbytes' 32-bit update, whose eps
//    is scaled by sqrt(bc2): p += -(lr sqrt(bc2) / bc1) * m / (sqrt(v) + eps sqrt(bc2)).
// Each op is the one bitsandbytes runs, on the same tensor, so one process
// (and any shard that cuts no block) equals it bitwise; a block that a shard
// boundary cuts is quantized in two parts, each with its own absmax.
// The master (the shard's parameters) is fp32 or bf16; a bf16 one is read
// into fp32 and rounded back, as bitsandbytes does for bf16 parameters.
//
// Host memory only: the moments' codes are read and written by the CPU.
// Not thread-safe: owned by a FlatParam, driven by the engine's step thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

#include "common/model/moment_blocks.h"
#include "worker/engine/optimizer.h"

namespace shardline {

// bitsandbytes' dynamic quantization map (create_dynamic_map(signed)): 256
// sorted fp32 codes, and the 65536-cell table from a normalized value's cell
// to its code.
class DynamicMap {
 public:
  static const DynamicMap& Signed();
  static const DynamicMap& Unsigned();

  const std::array<float, 256>& codes() const { return codes_; }
  // The code index of x in [-1, 1] (clamped; NaN to -1's, so that a block of
  // zeros, whose values are 0 * (1 / 0), reads back as -0.0 * 0).
  uint8_t Index(float x) const;
  // Quantizes x[0, n) as one block: writes its absmax and each element's index.
  void QuantizeBlock(const float* x, int64_t n, uint8_t* q, float* absmax) const;
  void DequantizeBlock(const uint8_t* q, int64_t n, float absmax, float* x) const;

 private:
  explicit DynamicMap(bool is_signed);
  std::array<float, 256> codes_{};
  std::vector<uint8_t> cells_;  // 65536
};

class AdamW8BitState final : public AdamWState {
 public:
  // Allocates a tensor of `numel` elements of `dtype` on the host, zeroed,
  // counted by the owner.
  using Allocate = std::function<at::Tensor(int64_t numel, at::ScalarType dtype)>;
  // The state of the range [first, first + count) of `layout`'s flat buffer.
  AdamW8BitState(const ShardLayout& layout, int64_t first, int64_t count, const Allocate& allocate);

  void Update(const AdamWStep& s, const at::Tensor& param, const at::Tensor& grad,
              const at::Tensor& clip_coef) override;
  at::Tensor exp_avg() const override { return Values(0); }
  at::Tensor exp_avg_sq() const override { return Values(1); }
  void Load(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) override;
  // "exp_avg.q8" and "exp_avg_sq.q8" (uint8, the quantized elements' codes,
  // in range order), "exp_avg.absmax" and "exp_avg_sq.absmax" (fp32, per block).
  Encoded Encode() const override;
  bool LoadEncoded(const Encoded& encoded) override;

  const MomentBlocks& blocks() const { return blocks_; }

 private:
  // Blocks an Update step takes at once (of a dense segment, as many elements).
  static constexpr int64_t kChunkBlocks = 64;
  // Where the chunk of quantized segment `s` (or dense one) that starts at
  // range element `pos` (a block's start) ends.
  static int64_t ChunkEnd(const MomentSegment& s, int64_t pos);
  // Moment k (0: m, 1: v) of the range elements [from, to) of a quantized
  // segment, on its blocks' bounds, into `out` (fp32, to - from), and back.
  void Dequantize(int k, const MomentSegment& s, int64_t from, int64_t to, float* out) const;
  void Quantize(int k, const MomentSegment& s, int64_t from, int64_t to, const float* in);
  at::Tensor Values(int k) const;

  const int64_t count_;
  const MomentBlocks blocks_;
  // Per moment: the quantized elements' codes, the blocks' absmax, the
  // dense elements' fp32 values.
  std::array<at::Tensor, 2> codes_, absmax_, dense_;
};

}  // namespace shardline
