// TableShard: what one rank's shard of a flat unit holds of a [rows, C]
// table inside it: a run of whole rows, and at most two rows in part (the
// shard's ends, or one row when the shard is narrower than a row).
//
// The engine's sparse embedding and vocabulary-parallel head
// (worker/engine/sparse_embedding.h, vocab_parallel_head.h) compute from a
// table's rows where they lie in the shard, with no gather, and the planner
// counts what they move; all read a shard through this one description.
// Pure arithmetic; thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/shard_layout.h"

namespace shardline {

struct TableShard {
  // Elements [column, column + width) of `row`, at shard position `at`.
  struct PartRow {
    int64_t row, column, width, at;
  };
  // Rows [full_lo, full_hi) whole, from shard position full_at on.
  int64_t full_lo = 0, full_hi = 0, full_at = 0;
  std::vector<PartRow> parts;

  int64_t full_rows() const { return full_hi - full_lo; }

  // The table of `rows` x `width` elements at `table_offset` in the flat
  // unit, as the shard [shard_begin, shard_begin + shard_numel) holds it.
  static TableShard Of(int64_t table_offset, int64_t rows, int64_t width, int64_t shard_begin, int64_t shard_numel);
  // The elements of `layout`'s flat unit that position `k` of a head over
  // `replicas` copies of the shard group holds (VocabParallelHead over the
  // world: each shard split in `replicas` parts, part r of shard s at
  // position s * replicas + r; one replica: shard k).
  struct Range {
    int64_t begin = 0, numel = 0;
  };
  static Range PartOf(const ShardLayout& layout, int replicas, int k);
  // What position `k` holds of `layout`'s parameter `param` (a [rows, width]
  // table), its shard's part as PartOf.
  static TableShard Of(const ShardLayout& layout, int param, int k, int replicas = 1);
  // The rows of `layout`'s parameter `param` that some position holds in
  // part (a part's end falls inside them), in order: the same on every rank.
  static std::vector<int64_t> CutRows(const ShardLayout& layout, int param, int replicas = 1);
};

}  // namespace shardline
