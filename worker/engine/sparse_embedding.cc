#include "worker/engine/sparse_embedding.h"

#include "common/base/ring_bytes.h"
#include "common/base/status_macros.h"

namespace shardline {
SparseEmbedding::SparseEmbedding(const ShardLayout& layout, int shard_rank)
    : width_(layout.params.at(0).spec.shape.at(1)),
      shard_begin_(layout.ShardOffset(shard_rank)),
      shard_numel_(layout.shard_numel) {
  for (size_t i = 0; i < layout.params.size(); ++i) {
    tables_.push_back({layout.params[i].offset, layout.params[i].spec.shape.at(0)});
    held_.push_back(TableShard::Of(layout, static_cast<int>(i), shard_rank));
  }
}

bool SparseEmbedding::RowsBeatAllReduce(int64_t tokens, int shard_size, int replicas) const {
  return comm::RowsGatherBeatsAllReduce(int64_t{shard_size} * tokens * width_, shard_numel_, replicas);
}

at::Tensor SparseEmbedding::IdsOf(const at::Tensor& all_ids, int k) {
  return all_ids.select(1, k).reshape({-1});
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
    const TableShard& h = held_[t];
    const at::Tensor table_ids = IdsOf(r.all_ids, t);
    // The first table's elements are copied, so that its rows stay the
    // table's to the bit (-0.0 included); a second one's are added, one
    // rounding, as the dense lookup's sum. (A token's row is whole or in
    // part, never both: the copies do not overlap.)
    auto write = [&](at::Tensor into, const at::Tensor& tokens, const at::Tensor& values) {
      if (t == 0) {
        into.index_copy_(0, tokens, values);
      } else {
        into.index_add_(0, tokens, values);
      }
    };
    if (h.full_hi > h.full_lo) {
      const at::Tensor tokens = at::nonzero(table_ids.ge(h.full_lo).logical_and(table_ids.lt(h.full_hi))).squeeze(1);
      const at::Tensor held = param_shard.narrow(0, h.full_at, (h.full_hi - h.full_lo) * width_).view({-1, width_});
      write(partial, tokens, held.index_select(0, table_ids.index_select(0, tokens).sub(h.full_lo)));
    }
    for (const TableShard::PartRow& p : h.parts) {
      const at::Tensor tokens = at::nonzero(table_ids.eq(p.row)).squeeze(1);
      const at::Tensor run = param_shard.narrow(0, p.at, p.width).unsqueeze(0).expand({tokens.size(0), p.width});
      write(partial.narrow(1, p.column, p.width), tokens, run.contiguous());
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

absl::StatusOr<at::Tensor> SparseEmbedding::Gradient(comm::Communicator& shard, comm::Communicator* replicas,
                                                     CommWaiter& waiter, const at::Tensor& all_ids,
                                                     const at::Tensor& grad, at::ScalarType reduce_dtype,
                                                     const std::function<void()>& issue) const {
  const int64_t g = shard.size();
  const at::Tensor own = grad.reshape({-1}).to(reduce_dtype).contiguous();
  at::Tensor all = at::empty({g * own.numel()}, own.options());
  std::shared_ptr<comm::Work> gather = shard.AllGather(all, own);
  if (issue) issue();
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
  const at::Tensor grads = all.view({-1, width_});  // a row per token
  at::Tensor part = at::zeros({shard_numel_}, own.options());
  for (size_t t = 0; t < tables_.size(); ++t) {
    const TableShard& h = held_[t];
    const at::Tensor table_ids = IdsOf(ids, static_cast<int>(t));
    if (h.full_hi > h.full_lo) {
      const at::Tensor tokens = at::nonzero(table_ids.ge(h.full_lo).logical_and(table_ids.lt(h.full_hi))).squeeze(1);
      part.narrow(0, h.full_at, (h.full_hi - h.full_lo) * width_)
          .view({-1, width_})
          .index_add_(0, table_ids.index_select(0, tokens).sub(h.full_lo), grads.index_select(0, tokens));
    }
    for (const TableShard::PartRow& p : h.parts) {
      const at::Tensor tokens = at::nonzero(table_ids.eq(p.row)).squeeze(1);
      part.narrow(0, p.at, p.width).add_(grads.index_select(0, tokens).narrow(1, p.column, p.width).sum(0));
    }
  }
  return part;
}

}  // namespace shardline
