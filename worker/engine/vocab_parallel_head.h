// VocabParallelHead: the loss of the language-model head over a vocabulary
// table that stays sharded ([parallelism] sparse_embedding: GPT-2's tied
// wte, the llama's lm_head), computed where the table's rows lie instead of
// gathering it, as Megatron's vocabulary-parallel cross-entropy does.
//
// Why: gathered for the head, the table is the largest all-gather of a
// micro-batch and its gradient the largest reduce-scatter (V x C each: 33.5
// MB for the small GPT, 98 MB for the ~100M llama), and the head waited for
// them while forward and backward were link-bound
// (bench/results/network_compare_*.md). Here each rank
// multiplies every rank's hidden states by the rows its shard holds: a rank
// sends its tokens' hidden states and receives their gradients, (G-1) n C
// (param + reduce) bytes, against (G-1)/G V C (param + reduce) bytes
// (comm::VocabParallelBeatsGather decides which).
//
// One micro-batch over a shard group of G ranks with n tokens each:
//  1. every rank's hidden states [n, C] and targets are all-gathered, while
//     2 computes for the rank's own tokens (the gather's wait, and the
//     ranks' skew arriving at it, hide behind 1/G of 2); over the world,
//     while 2 computes for its own tokens the gather's first stage across
//     the replicas runs, and for the replicas' tokens the shard group's;
//  2. each rank computes, for all G n tokens, the logits of the rows it
//     holds whole (the compute dtype's matmul, then fp32, as
//     LinearCrossEntropy), their logsumexp, the logit of each token's
//     target where it holds that row, and its elements' share of each row
//     the shards cut (TableShard::parts; fp32 dot products);
//  3. those [G n, 2 + cut rows] statistics are all-gathered: every rank then
//     has each token's logsumexp over the vocabulary and target logit. In
//     two halves of the group's tokens (split at a rank's boundary), each
//     issued once computed, the first always first: the first half's
//     exchange (and the ranks' skew in reaching it) hides behind the second
//     half's statistics, the second's behind the first half's step 4;
//  4. training: each rank turns its logits into dL/dlogits ((softmax -
//     onehot) x scale on counted tokens, rounded to the compute dtype as
//     autograd rounds them), into its share of dL/dh for every token (fp32,
//     reduce-scattered in the reduce dtype to each rank's own tokens) and
//     into the gradient of the rows it holds: this rank's shard of the
//     table's gradient, summed over the group's tokens, with no
//     reduce-scatter.
// The loss returned is the rank's own tokens' (summed over the group it is
// the group's).
//
// Over the world (hybrid strategies, `replicas` > 1): the group is every
// rank, each shard split in `replicas` parts, and a rank computes over its
// replica's part of its shard for every rank's tokens (TableShard::PartOf).
// The table's gradient part it returns is then the world's already: the
// replicas exchange their parts (an all-gather, (R-1)/R of a shard) instead
// of all-reducing the shard (twice that), for R-1 times a rank's hidden
// states and their gradients across the replicas. The gathers cross the
// replicas first (a rank's own tokens cross once), the reduce-scatter the
// shard group first (a rank's own tokens' sums cross once).
//
// The caller may issue collectives of its own (`issue`, the engine's
// backward prefetch) at two points: one before 2, where the link would idle
// while the statistics compute (the statistics' exchanges queue behind it:
// late only where that one collective takes longer than the statistics'
// compute), and the rest once both halves of 3 are issued, while 4
// computes (dL/dh's reduce-scatter queues behind them). A communicator runs
// its ops in call order, on every rank the same.
//
// Numerics against LinearCrossEntropy in one process: the logit of a whole
// row is the same dot product; a cut row's logit, the logsumexp, dL/dh (G
// partial products over the vocabulary, then one rounding) and the rows'
// gradients (the group's tokens at once) are the same terms summed in
// another fp32 order.
//
// Memory (G: the group's ranks, the world's over the world): every rank's
// hidden states [G n, C] (compute dtype), the logits of
// this rank's rows for them, [G n, V/G] fp32 (what one process holds for n
// tokens over V; kept for the gradient where they fit in 2^26 logits, else
// in chunks of at most that, each computed again for the gradient), dL/dh [G n, C] fp32 and a shard's
// fp32 gradient.
// Not thread-safe: the engine's step thread drives it. Errors: a failed
// collective (the communicator's).
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

class VocabParallelHead {
 public:
  // The table is `layout`'s parameter `param` ([V, C]: GPT-2's wte, first in
  // the embed unit; the llama's lm_head, after the norm in the head unit);
  // `shard_rank` is this rank's place in the group the layout shards over,
  // `replica` its place among `replicas` copies of that group (over the
  // world where `replicas` > 1).
  VocabParallelHead(const ShardLayout& layout, int param, int shard_rank, int replicas = 1, int replica = 0);

  // What Run computes beyond the loss.
  struct Want {
    bool grad_hidden = false;  // dL/dh of this rank's tokens
    bool grad_table = false;   // this rank's shard of the table's gradient
    at::ScalarType reduce_dtype = at::kFloat;
    int64_t chunk_rows = 0;  // tokens per chunk of logits; <= 0: at most 2^26 logits
  };
  struct Result {
    at::Tensor loss;         // fp32 scalar: this rank's tokens' cross-entropies, times scale
    at::Tensor grad_hidden;  // [n, C], hidden's dtype (Want::grad_hidden)
    at::Tensor grad_table;   // [part_numel], reduce dtype; zero outside the table (Want::grad_table)
  };
  // `hidden` [n, C] in the compute dtype (the final norm's output), `targets`
  // [n] int64 (-100: ignored), `table_part` this rank's part of the flat
  // unit (part_numel elements from part_begin of its shard, the compute
  // dtype). `replicas` is the replicate group (over the world; else
  // ignored, may be null). Every rank of the group calls it with the same
  // n. `issue(most)` (may be empty; training only) issues at most `most` of
  // the caller's collectives: issue(1) once step 1's exchange is issued, then
  // issue(INT_MAX) once the statistics' exchanges are issued.
  absl::StatusOr<Result> Run(comm::Communicator& shard, comm::Communicator* replicas, CommWaiter& waiter,
                             const at::Tensor& hidden, const at::Tensor& targets, const at::Tensor& table_part,
                             double scale, const Want& want, const std::function<void(int)>& issue) const;

  // This rank's part of its shard: the whole shard unless over the world.
  int64_t part_begin() const { return part_begin_; }
  int64_t part_numel() const { return part_numel_; }
  bool over_world() const { return replicas_ > 1; }

  // Rows of the table cut between shards, in order (every rank's, the same
  // on each).
  const std::vector<int64_t>& cut_rows() const { return cut_rows_; }

 private:
  struct Chunk;
  class Group;
  class Pass;
  // The fp32 logits of the whole rows held ([k, full rows]) for hidden
  // states [k, C].
  static at::Tensor WholeRowLogits(const at::Tensor& hidden, const at::Tensor& held);

  int64_t vocab_, width_;
  int replicas_, position_;  // position: in the group's order (shard rank x replicas + replica)
  int64_t part_begin_ = 0, part_numel_ = 0;
  TableShard held_;
  std::vector<int64_t> cut_rows_;
  std::vector<int64_t> part_index_;  // held_.parts[i]'s index in cut_rows_
};

}  // namespace shardline
