// SparseEmbedding: the token table of an embed unit whose parameters are
// sharded ([parallelism] sparse_embedding), looked up and trained without
// being gathered for it.
//
// Why: the embed unit is the first all-gather of every forward and the last
// reduce-scatter of every backward, with no compute to hide behind
// (bench/results/network_compare_*.md), and it is the largest unit (vocab x
// hidden: 2^30 bytes for Llama 3 8B in bf16), though a micro-batch reads
// only its tokens' rows of it. Here a rank moves a few rows per token
// instead. Untied, the table is then never gathered; tied, the head
// computes its loss over the table's shards (vocab_parallel_head.h), or,
// where that moves more bytes, the engine gathers it behind the blocks'
// forward and reduces the head's part of its gradient behind their backward
// (engine.h).
//
// The unit's parameters are its tables, [rows, C] each, summed into the
// hidden state: the first looked up by token id, a second (GPT-2's wpe) by
// position. Each rank's shard of the flat unit holds a contiguous range of
// their elements (whole rows, and parts of rows at its ends).
//  - Lookup: every rank's ids (tokens, and positions where there is a second
//    table) are all-gathered over the shard group; each rank writes, for
//    every token of every rank, the sum of the elements of its rows that its
//    shard holds (zero elsewhere), and a reduce-scatter of those
//    [ranks x tokens, C] partial rows hands each rank its own tokens' rows.
//    Every element of each table comes from exactly one rank and the others
//    add zeros, so the rows are the tables' (and their sum), exactly.
//  - Gradient: every rank's output gradients are all-gathered (in the reduce
//    dtype) and each rank adds those of the tokens whose rows it holds into
//    a shard-sized gradient (index_add, in token order, table by table). The
//    sum is the dense reduce-scatter's in another order. Across replicas
//    (hybrid strategies) the shard is then all-reduced as any unit's, or,
//    where every replica's rows are fewer bytes than that all-reduce
//    (RowsBeatAllReduce), those rows are all-gathered across the replicas
//    too and added likewise: the gradient is then the world's, and no
//    all-reduce of the table's shard ends the step.
// Bytes a rank receives per micro-batch of N tokens over a group of G, with
// K tables: (G-1) N (8 K + C param bytes) forward and (G-1) N C reduce bytes
// backward, against (G-1)/G V C (param + reduce bytes) gathered and
// reduce-scattered.
//
// Not thread-safe: the engine's step thread drives it. Errors: a failed
// collective (the communicator's). Token ids are the dataset's, which
// refuses any outside the vocabulary; positions are below block_size.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "common/model/shard_layout.h"
#include "worker/comm/comm_waiter.h"
#include "worker/comm/communicator.h"
#include "common/model/table_shard.h"

namespace shardline {

class SparseEmbedding {
 public:
  // The embed unit's layout (its parameters are the tables: [V, C] by token,
  // then at most one [T, C] by position) and this rank's place in the shard
  // group.
  SparseEmbedding(const ShardLayout& layout, int shard_rank);

  // Whether a second table is looked up by position.
  bool by_position() const { return tables_.size() > 1; }
  // Whether gathering the rows' gradients of `replicas` replicas, each of
  // a shard group of `shard_size` ranks with `tokens` per micro-batch,
  // moves fewer bytes than all-reducing the shard across them: then the
  // gathered rows are also fewer bytes than two shards.
  bool RowsBeatAllReduce(int64_t tokens, int shard_size, int replicas) const;

  struct Rows {
    at::Tensor hidden;   // [B, T, C], the tables' dtype: this rank's tokens' rows, summed
    at::Tensor all_ids;  // every rank's ids, [ranks, tables, B * T]: what Gradient needs
  };
  // The hidden states of token ids `ids` [B, T] at `positions` [B, T]
  // (undefined where there is no table by position) from this rank's shard
  // of the unit (`param_shard`, shard_numel elements). Every rank of the
  // group calls it with the same B and T.
  absl::StatusOr<Rows> Lookup(comm::Communicator& shard, CommWaiter& waiter, const at::Tensor& ids,
                              const at::Tensor& positions, const at::Tensor& param_shard) const;
  // This rank's shard (shard_numel, `reduce_dtype`) of the table's gradient
  // for the lookup that gave `all_ids`, given this rank's output gradient
  // `grad` [B, T, C]: over the shard group, or with `replicas` (null: none)
  // over every replica of it too. Every rank of the group (and of
  // `replicas`) calls it. `issue` (may be empty) runs once the shard
  // group's exchange is issued, before it is waited for: the caller's
  // collectives then queue behind it, not it behind them.
  absl::StatusOr<at::Tensor> Gradient(comm::Communicator& shard, comm::Communicator* replicas, CommWaiter& waiter,
                                      const at::Tensor& all_ids, const at::Tensor& grad, at::ScalarType reduce_dtype,
                                      const std::function<void()>& issue = nullptr) const;

 private:
  struct Table {
    int64_t offset, rows;  // in the flat unit
  };
  // Table k's ids of every rank, in rank order, from Rows::all_ids.
  static at::Tensor IdsOf(const at::Tensor& all_ids, int k);

  std::vector<Table> tables_;
  // Per table. Lookup and Gradient move its whole rows with index_select /
  // index_add on their [rows, C] view, which costs what the rows weigh
  // (per-element positions would cost twice the rows' fp32 bytes again in
  // int64 indices).
  std::vector<TableShard> held_;
  int64_t width_;
  int64_t shard_begin_, shard_numel_;
};

}  // namespace shardline
