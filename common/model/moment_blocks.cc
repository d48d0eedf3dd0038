#include "common/model/moment_blocks.h"

#include <algorithm>

namespace shardline {

int64_t MomentBlocks::BlockOf(const MomentSegment& s, int64_t i) {
  const int64_t at = s.tensor_first + (i - s.begin);
  return s.first_block + at / kBlockNumel - s.tensor_first / kBlockNumel;
}

void MomentBlocks::BlockBounds(const MomentSegment& s, int64_t block, int64_t* begin, int64_t* end) {
  // The tensor's block that is the segment's `block`, cut to the segment.
  const int64_t tensor_block = s.tensor_first / kBlockNumel + (block - s.first_block);
  const int64_t lo = tensor_block * kBlockNumel, hi = lo + kBlockNumel;
  *begin = s.begin + std::max(lo, s.tensor_first) - s.tensor_first;
  *end = s.begin + std::min(hi, s.tensor_first + (s.end - s.begin)) - s.tensor_first;
}

MomentBlocks CutMomentBlocks(const ShardLayout& layout, int64_t first, int64_t count) {
  MomentBlocks out;
  const int64_t last = first + count;
  for (const ParamSlot& slot : layout.params) {
    const int64_t n = slot.spec.numel();
    const int64_t lo = std::max(first, slot.offset), hi = std::min(last, slot.offset + n);
    if (lo >= hi) continue;
    MomentSegment s;
    s.begin = lo - first;
    s.end = hi - first;
    s.tensor_first = lo - slot.offset;
    s.quantized = n >= MomentBlocks::kMin8BitNumel;
    s.decay = slot.spec.decay;
    if (s.quantized) {
      s.storage = out.quantized;
      s.first_block = out.blocks;
      const int64_t k = MomentBlocks::kBlockNumel;
      s.blocks = (s.tensor_first + (hi - lo) + k - 1) / k - s.tensor_first / k;
      out.quantized += hi - lo;
      out.blocks += s.blocks;
    } else {
      s.storage = out.dense;
      out.dense += hi - lo;
    }
    out.segments.push_back(s);
  }
  return out;
}

}  // namespace shardline
