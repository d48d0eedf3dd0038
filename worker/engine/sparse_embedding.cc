#include "worker/engine/sparse_embedding.h"

#include <algorithm>

#include "common/base/status_macros.h"

namespace shardline {

SparseEmbedding::SparseEmbedding(const ShardLayout& layout, int shard_rank)
    : width_(layout.params.at(0).spec.shape.at(1)),
      shard_begin_(layout.ShardOffset(shard_rank)),
      shard_numel_(layout.shard_numel) {
  for (const auto& p : layout.params) tables_.push_back({p.offset, p.spec.shape.at(0)});
}

at::Tensor SparseEmbedding::IdsOf(const at::Tensor& all_ids, int k) {
  return all_ids.select(1, k).reshape({-1});
}

SparseEmbedding::Held SparseEmbedding::HeldRows(const Table& table, const at::Tensor& ids) const {
  // Rows [lo, hi) overlap the shard's elements [shard_begin, shard_begin + numel).
  const int64_t first = shard_begin_ - table.offset, last = first + shard_numel_;  // table elements
  const int64_t lo = std::clamp<int64_t>(first / width_, 0, table.rows);
  const int64_t hi = std::clamp<int64_t>((last + width_ - 1) / width_, lo, table.rows);
  Held h;
  h.tokens = at::nonzero(ids.ge(lo).logical_and(ids.lt(hi))).squeeze(1);
  const at::Tensor row_start = ids.index_select(0, h.tokens).mul(width_).sub_(first);  // [S], in the shard
  h.positions = row_start.unsqueeze(1) + at::arange(width_, ids.options()).unsqueeze(0);  // [S, C]
  h.inside = h.positions.ge(0).logical_and(h.positions.lt(shard_numel_));
  h.positions.clamp_(0, std::max<int64_t>(0, shard_numel_ - 1));
  return h;
}

absl::StatusOr<SparseEmbedding::Rows> SparseEmbedding::Lookup(comm::Communicator& shard, CommWaiter& waiter,
                                                              const at::Tensor& ids, const at::Tensor& positions,
                                                              const at::Tensor& param_shard) const {
  const int64_t g = shard.size(), n = ids.numel(), k = static_cast<int64_t>(tables_.size());
  std::vector<at::Tensor> own_ids = {ids.reshape({-1}).to(at::kLong)};
  if (by_position()) own_ids.push_back(positions.expand_as(ids).reshape({-1}).to(at::kLong));
  const at::Tensor own = at::stack(own_ids).contiguous();  // [tables, n]
  Rows r;
  r.all_ids = at::empty({g, k, n}, own.options());
  std::shared_ptr<comm::Work> gather = shard.AllGather(r.all_ids.view({-1}), own.view({-1}));
  SL_RETURN_IF_ERROR(waiter.OnDevice(*gather, comm::Op::kAllGather));
  const at::Tensor partial = at::zeros({g * n, width_}, param_shard.options());
  for (int t = 0; t < k; ++t) {
    const Held held = HeldRows(tables_[t], IdsOf(r.all_ids, t));
    const at::Tensor values = param_shard.index({held.positions}).masked_fill_(held.inside.logical_not(), 0);
    // The first table's elements are copied, so that its rows stay the
    // table's to the bit (-0.0 included); a second one's are added, one
    // rounding, as the dense lookup's sum.
    if (t == 0) {
      partial.index_copy_(0, held.tokens, values);
    } else {
      partial.index_add_(0, held.tokens, values);
    }
  }
  const at::Tensor out = at::empty({n * width_}, param_shard.options());
  std::shared_ptr<comm::Work> scatter = shard.ReduceScatter(out, partial.view({-1}));
  SL_RETURN_IF_ERROR(waiter.OnDevice(*scatter, comm::Op::kReduceScatter));
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(width_);
  r.hidden = out.view(shape);
  return r;
}

bool SparseEmbedding::RowsBeatAllReduce(int64_t tokens, int shard_size, int replicas) const {
  // Received: (R - 1) G N C elements; a ring all-reduce sends 2 (R - 1) / R
  // of the shard.
  return int64_t{replicas} * shard_size * tokens * width_ < 2 * shard_numel_;
}

absl::StatusOr<at::Tensor> SparseEmbedding::Gradient(comm::Communicator& shard, comm::Communicator* replicas,
                                                     CommWaiter& waiter, const at::Tensor& all_ids,
                                                     const at::Tensor& grad, at::ScalarType reduce_dtype) const {
  const int64_t g = shard.size();
  const at::Tensor own = grad.reshape({-1}).to(reduce_dtype).contiguous();
  at::Tensor all = at::empty({g * own.numel()}, own.options());
  std::shared_ptr<comm::Work> gather = shard.AllGather(all, own);
  SL_RETURN_IF_ERROR(waiter.OnDevice(*gather, comm::Op::kAllGather));
  at::Tensor ids = all_ids;
  if (replicas && replicas->size() > 1) {  // every replica's rows and ids, replica by replica
    const int64_t r = replicas->size();
    const at::Tensor world = at::empty({r * all.numel()}, all.options());
    ids = at::empty({r * all_ids.size(0), all_ids.size(1), all_ids.size(2)}, all_ids.options());
    std::shared_ptr<comm::Work> rows = replicas->AllGather(world, all);
    std::shared_ptr<comm::Work> world_ids = replicas->AllGather(ids.view({-1}), all_ids.reshape({-1}));
    SL_RETURN_IF_ERROR(waiter.OnDevice(*rows, comm::Op::kAllGather));
    SL_RETURN_IF_ERROR(waiter.OnDevice(*world_ids, comm::Op::kAllGather));
    all = world;
  }
  at::Tensor part = at::zeros({shard_numel_}, own.options());
  for (size_t t = 0; t < tables_.size(); ++t) {
    const Held held = HeldRows(tables_[t], IdsOf(ids, static_cast<int>(t)));
    const at::Tensor rows = all.view({-1, width_}).index_select(0, held.tokens);  // [S, C]
    part.index_add_(0, held.positions.masked_select(held.inside), rows.masked_select(held.inside));
  }
  return part;
}

}  // namespace shardline
