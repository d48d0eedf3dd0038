// MomentBlocks: how 8-bit Adam moments ([optimizer] moments_dtype = "8bit",
// worker/engine/adamw_8bit.h) lie over a range of a unit's flat buffer.
//
// bitsandbytes' AdamW8bit quantizes each parameter tensor on its own: a
// tensor of at least kMin8BitNumel elements keeps each moment as one byte an
// element, in blocks of kBlockNumel from its first element, each block with
// an fp32 absmax; a smaller tensor keeps fp32 moments. A rank holds a range
// of the flat buffer (its shard, or its piece of it): the range holds each
// tensor's part that falls in it, cut into the parts of the tensor's blocks
// that fall in it. A block the range's boundary cuts is two blocks, one on
// either side, each with its own absmax (so no rank needs another's values
// to quantize; one range per tensor, as in one process, equals bitsandbytes).
// Padding past the unit's parameters belongs to no segment.
//
// Pure arithmetic, no LibTorch: the engine allocates from it and the planner
// counts with it, so the two agree to the byte. Any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/shard_layout.h"

namespace shardline {

struct MomentSegment {
  int64_t begin = 0, end = 0;  // in the range: [begin, end)
  int64_t tensor_first = 0;    // the tensor's element at `begin`
  bool quantized = false;      // 8-bit (else fp32 moments)
  bool decay = false;          // weight decay applies
  // Quantized: its codes at [storage, storage + end - begin) of the range's
  // codes, and its blocks' absmax at [first_block, first_block + blocks).
  // Else: its fp32 moments at [storage, ...) of the range's dense moments.
  int64_t storage = 0;
  int64_t first_block = 0, blocks = 0;
};

struct MomentBlocks {
  static constexpr int64_t kBlockNumel = 256;
  static constexpr int64_t kMin8BitNumel = 4096;  // bitsandbytes' min_8bit_size

  std::vector<MomentSegment> segments;  // in order
  int64_t quantized = 0;  // elements with 8-bit moments
  int64_t dense = 0;      // elements with fp32 moments
  int64_t blocks = 0;

  // What both moments hold: a byte each per quantized element, an absmax
  // each per block, an fp32 each per dense element.
  int64_t bytes() const { return 2 * quantized + 2 * 4 * blocks + 2 * 4 * dense; }
  // The block of a quantized segment that holds element `i` of the range,
  // and where that block starts and ends in the range.
  static int64_t BlockOf(const MomentSegment& s, int64_t i);
  static void BlockBounds(const MomentSegment& s, int64_t block, int64_t* begin, int64_t* end);
};

// The segments of the range [first, first + count) of `layout`'s flat buffer
// (first: an element of the unpadded or padded buffer; count >= 0).
MomentBlocks CutMomentBlocks(const ShardLayout& layout, int64_t first, int64_t count);

}  // namespace shardline
