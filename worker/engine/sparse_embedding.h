// SparseEmbedding: the token table of an untied embed unit whose parameters
// are sharded ([parallelism] sparse_embedding), looked up and trained without
// ever being gathered.
//
// Why: the embed unit is the first all-gather of every forward and, untied,
// the last reduce-scatter of every backward, with no compute to hide behind
// (bench/results/network_compare_llama100m.md), and it is the largest unit
// (vocab x hidden: 2^30 bytes for Llama 3 8B in bf16), though a micro-batch
// reads only its tokens' rows of it. Here a rank moves a few rows per token
// instead.
//
// Each rank's shard of the flat unit holds a contiguous range of the table's
// elements (whole rows, and parts of rows at its ends).
//  - Lookup: every rank's token ids are all-gathered over the shard group;
//    each rank writes, for every token of every rank, the elements of its row
//    that its shard holds (zero elsewhere), and a reduce-scatter of those
//    [ranks x tokens, C] partial rows hands each rank its own tokens' rows.
//    Every element comes from exactly one rank and the others add zeros, so
//    the rows are the table's, exactly.
//  - Gradient: every rank's output gradients are all-gathered (in the reduce
//    dtype) and each rank adds those of the tokens whose rows it holds into
//    a shard-sized gradient (index_add, in token order). The sum is the
//    dense reduce-scatter's in another order.
// Bytes a rank receives per micro-batch of N tokens over a group of G:
// (G-1) N (8 + C param bytes) forward and (G-1) N C reduce bytes backward,
// against (G-1)/G V C (param + reduce bytes) gathered and reduce-scattered.
//
// Not thread-safe: the engine's step thread drives it. Errors: a failed
// collective (the communicator's). Token ids are the dataset's, which
// refuses any outside the vocabulary.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "common/model/shard_layout.h"
#include "worker/comm/comm_waiter.h"
#include "worker/comm/communicator.h"

namespace shardline {

class SparseEmbedding {
 public:
  // The embed unit's layout (its first parameter is the [V, C] table) and
  // this rank's place in the shard group.
  SparseEmbedding(const ShardLayout& layout, int shard_rank);

  struct Rows {
    at::Tensor hidden;  // [B, T, C], the table's dtype: this rank's tokens' rows
    at::Tensor all_ids;  // every rank's token ids, in rank order: what Gradient needs
  };
  // The rows of token ids `ids` [B, T] (int64) from this rank's shard of the
  // unit (`param_shard`, shard_numel elements). Every rank of the group calls
  // it with the same B and T.
  absl::StatusOr<Rows> Lookup(comm::Communicator& shard, CommWaiter& waiter, const at::Tensor& ids,
                              const at::Tensor& param_shard) const;
  // This rank's shard (shard_numel, `reduce_dtype`) of the table's gradient
  // for the lookup that gave `all_ids`, given this rank's output gradient
  // `grad` [B, T, C]. Every rank of the group calls it.
  absl::StatusOr<at::Tensor> Gradient(comm::Communicator& shard, CommWaiter& waiter, const at::Tensor& all_ids,
                                      const at::Tensor& grad, at::ScalarType reduce_dtype) const;

 private:
  // The tokens of `all_ids` whose rows this shard holds a part of, and for
  // each the shard positions of its row's C elements ([S, C], int64) with
  // a mask of those inside the shard. Lookup and Gradient each compute it
  // from the ids rather than keep it from forward to backward: the positions
  // alone are twice the rows' fp32 bytes, held through the whole model.
  struct Held {
    at::Tensor tokens, positions, inside;
  };
  Held HeldRows(const at::Tensor& all_ids) const;

  int64_t table_offset_, rows_, width_;
  int64_t shard_begin_, shard_numel_;
};

}  // namespace shardline
