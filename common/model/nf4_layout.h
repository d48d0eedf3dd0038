// Nf4Layout: how a frozen block's projection matrices lie in NF4 ([lora]
// base_dtype = "nf4", worker/engine/nf4_base.h) over a shard group.
//
// Each matrix is quantized whole in blocks of kBlockNumel values (the last
// may be partial), each block 32 bytes of codes and a byte of absmax; the
// absmax are quantized again per kScaleBlock blocks of the matrix, an fp32
// scale each, and the matrix keeps one fp32 offset. The unit numbers its
// matrices' blocks in order, B in all; rank r of G owns blocks
// [r P, (r + 1) P), P = ceil(B / G), as one piece of P * kBlockBytes bytes
// (its blocks' codes, then their absmax); the scales and offsets are every
// rank's, whole. Which parameters are matrices: those of two dimensions
// (bitsandbytes' Linear4bit quantizes the linear layers' weights alone).
//
// Pure arithmetic, no LibTorch: the engine lays its buffers out from it and
// the planner counts with it, so the two agree to the byte. Any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/shard_layout.h"

namespace shardline {

struct Nf4Placement {
  int64_t numel = 0;
  int64_t first_block = 0, blocks = 0;  // in the unit's block order
  int64_t first_scale = 0, scales = 0;  // in the unit's scales
  int64_t value_offset = 0;             // in the dequantized matrices' buffer
};

struct Nf4Layout {
  static constexpr int64_t kBlockNumel = 64;
  static constexpr int64_t kScaleBlock = 256;  // blocks per scale
  static constexpr int64_t kCodeBytes = kBlockNumel / 2;
  static constexpr int64_t kBlockBytes = kCodeBytes + 1;

  int group_size = 1;
  std::vector<Nf4Placement> matrices;
  int64_t blocks = 0, scales = 0, numel = 0;
  int64_t piece_blocks = 0;  // P

  int64_t piece_bytes() const { return piece_blocks * kBlockBytes; }
  // One all-gather's output: every rank's piece.
  int64_t gathered_bytes() const { return group_size * piece_bytes(); }
  // What a rank keeps between uses: its piece, the scales and the offsets.
  int64_t resident_bytes() const {
    return piece_bytes() + 4 * scales + 4 * static_cast<int64_t>(matrices.size());
  }
};

bool IsNf4Matrix(const ParamSpec& p);
// A unit's parameters parted as an NF4 base holds them: its matrices (with
// each one's index among the unit's parameters) and the dense rest, each in
// the unit's order.
struct Nf4Split {
  std::vector<ParamSpec> matrices, dense;
  std::vector<int> matrix_index;
};
Nf4Split SplitNf4Matrices(std::vector<ParamSpec> params);
// `numels`: each matrix's, in the unit's order.
Nf4Layout MakeNf4Layout(const std::vector<int64_t>& numels, int group_size);

}  // namespace shardline
