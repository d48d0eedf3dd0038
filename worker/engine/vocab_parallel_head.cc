#include "worker/engine/vocab_parallel_head.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "common/base/status_macros.h"

namespace shardline {
namespace {

constexpr int64_t kIgnoreIndex = -100;     // at::cross_entropy_loss's default
constexpr int64_t kChunkLogits = 1 << 26;  // 256 MiB of fp32 logits per chunk, as LinearCrossEntropy's

}  // namespace

// One chunk of every rank's tokens: rows [r0, r0 + k) of the gathered
// hidden states, with their targets and which of them this rank's whole
// rows hold.
struct VocabParallelHead::Chunk {
  int64_t r0, k;
  at::Tensor hidden;   // [k, C]: the gathered rows, or this rank's own tokens' before they are gathered
  at::Tensor targets;  // [k] int64
  at::Tensor mine;     // [k] bool: the target is a whole row held here
  at::Tensor index;    // [k, 1]: the target's column in this rank's logits (0 where not mine)
};

VocabParallelHead::VocabParallelHead(const ShardLayout& layout, int param, int shard_rank, int replicas, int replica)
    : vocab_(layout.params.at(param).spec.shape.at(0)),
      width_(layout.params.at(param).spec.shape.at(1)),
      replicas_(replicas),
      position_(shard_rank * replicas + replica) {
  const TableShard::Range range = TableShard::PartOf(layout, replicas, position_);
  part_begin_ = range.begin - layout.ShardOffset(shard_rank);
  part_numel_ = range.numel;
  held_ = TableShard::Of(layout, param, position_, replicas);
  cut_rows_ = TableShard::CutRows(layout, param, replicas);
  for (const auto& p : held_.parts) {
    part_index_.push_back(std::lower_bound(cut_rows_.begin(), cut_rows_.end(), p.row) - cut_rows_.begin());
  }
}

// The head's group: the shard group, or over replicas every rank of the
// world, in position order (shard rank s, replica r: s * R + r).
class VocabParallelHead::Group {
 public:
  Group(comm::Communicator& shard, comm::Communicator* replicas, CommWaiter& waiter)
      : shard_(shard), replicas_(replicas && replicas->size() > 1 ? replicas : nullptr), waiter_(waiter) {}

  int size() const { return shard_.size() * (replicas_ ? replicas_->size() : 1); }

  // A gather of each pair's own [m] into out [size * m], in position order:
  // across the replicas first (a rank's own tokens cross the link between
  // shard groups once), then their R m over the shard group. Begun by
  // StartAllGather, which issues the first stage; ShardStage waits for the
  // stage across the replicas and issues the shard group's (the first
  // without replicas); Finish waits for it.
  struct Gather {
    std::vector<std::pair<at::Tensor, at::Tensor>> out_own;
    std::vector<at::Tensor> staged;  // each pair's R m gathered across the replicas (own m without)
    std::vector<std::shared_ptr<comm::Work>> works;  // the stage in flight
    bool sharded = false;                            // the shard group's stage is issued
  };

  Gather StartAllGather(std::vector<std::pair<at::Tensor, at::Tensor>> out_own) {
    Gather g{std::move(out_own)};
    for (const auto& [out, mine] : g.out_own) {
      if (!replicas_) {
        g.staged.push_back(mine);
        continue;
      }
      g.staged.push_back(at::empty({replicas_->size() * mine.numel()}, mine.options()));
      g.works.push_back(replicas_->AllGather(g.staged.back(), mine));
    }
    if (!replicas_) IssueShardStage(g);
    return g;
  }

  absl::Status ShardStage(Gather& g) {
    if (g.sharded) return absl::OkStatus();
    SL_RETURN_IF_ERROR(WaitAll(g.works, comm::Op::kAllGather));
    IssueShardStage(g);
    return absl::OkStatus();
  }

  absl::Status Finish(Gather& g) {
    SL_RETURN_IF_ERROR(ShardStage(g));
    return WaitAll(g.works, comm::Op::kAllGather);
  }

  absl::Status AllGather(std::vector<std::pair<at::Tensor, at::Tensor>> out_own) {
    Gather g = StartAllGather(std::move(out_own));
    return Finish(g);
  }

  absl::Status WaitAll(std::vector<std::shared_ptr<comm::Work>>& works, comm::Op op) {
    for (const auto& w : std::exchange(works, {})) SL_RETURN_IF_ERROR(waiter_.OnDevice(*w, op));
    return absl::OkStatus();
  }

  // Sums `send` [size * m] over the group into own [m], this position's
  // block: over the shard group first, then across the replicas. Returns
  // the last stage's work.
  absl::StatusOr<std::shared_ptr<comm::Work>> ReduceScatter(const at::Tensor& own, const at::Tensor& send) {
    if (!replicas_) return shard_.ReduceScatter(own, send);
    staged_ = at::empty({replicas_->size() * own.numel()}, own.options());
    SL_RETURN_IF_ERROR(waiter_.OnDevice(*shard_.ReduceScatter(staged_, send), comm::Op::kReduceScatter));
    return replicas_->ReduceScatter(own, staged_);
  }

 private:
  void IssueShardStage(Gather& g) {
    for (size_t i = 0; i < g.out_own.size(); ++i) g.works.push_back(shard_.AllGather(g.out_own[i].first, g.staged[i]));
    g.sharded = true;
  }

  comm::Communicator& shard_;
  comm::Communicator* const replicas_;
  CommWaiter& waiter_;
  // The reduce-scatter's first stage, read by the second until the caller
  // waits for it: freed with the group, after that wait.
  at::Tensor staged_;
};

at::Tensor VocabParallelHead::WholeRowLogits(const at::Tensor& hidden, const at::Tensor& held) {
  return at::linear(hidden, held).to(at::kFloat);
}

absl::StatusOr<VocabParallelHead::Result> VocabParallelHead::Run(comm::Communicator& shard,
                                                                 comm::Communicator* replicas, CommWaiter& waiter,
                                                                 const at::Tensor& hidden, const at::Tensor& targets,
                                                                 const at::Tensor& table_part, double scale,
                                                                 const Want& want,
                                                                 const std::function<void(int)>& issue) const {
  if (replicas_ > 1 && (!replicas || replicas->size() != replicas_)) {
    return absl::InvalidArgumentError("vocabulary-parallel head: built over the world, run without its replicas");
  }
  Group group(shard, replicas_ > 1 ? replicas : nullptr, waiter);
  const int64_t g = group.size(), n = hidden.size(0), C = width_, rows = g * n;
  const int64_t cuts = static_cast<int64_t>(cut_rows_.size()), vr = held_.full_rows();
  const at::TensorOptions f32 = hidden.options().dtype(at::kFloat);
  // 1. Every rank's hidden states and targets, in flight while 2 computes
  // the rows already here: this rank's own tokens, then (over the world)
  // its replicas' once the first stage is in.
  const at::Tensor own_hidden = hidden.detach().contiguous();
  const at::Tensor own_targets = targets.reshape({-1}).to(at::kLong).contiguous();
  const at::Tensor all_hidden = at::empty({rows, C}, hidden.options());
  const at::Tensor all_targets = at::empty({rows}, own_targets.options());
  Group::Gather gather =
      group.StartAllGather({{all_hidden.view({-1}), own_hidden.view({-1})}, {all_targets, own_targets}});
  const bool train = want.grad_hidden || want.grad_table;
  bool first_issued = false;  // the caller's first collective, queued behind the shard group's stage
  auto issue_first = [&] {
    if (train && issue && !first_issued) issue(1);
    first_issued = true;
  };
  if (gather.sharded) issue_first();

  // 2. This rank's statistics: [logsumexp of its whole rows, its target
  // logits, its elements' share of each cut row's logit]. Its own tokens
  // first, then the others' once they are in.
  const at::Tensor held = vr > 0 ? table_part.narrow(0, held_.full_at, vr * C).view({vr, C}) : at::Tensor();
  const int64_t chunk_rows =
      want.chunk_rows > 0 ? want.chunk_rows : std::max<int64_t>(1, kChunkLogits / std::max<int64_t>(1, vr));
  // Where every token's logits fit in one chunk's budget they are all kept
  // for the gradient; else each chunk's are computed again.
  const bool keep = rows <= chunk_rows;
  const int64_t own0 = position_ * n;
  std::vector<Chunk> chunks;
  // Chunks of rows [begin, end), read from `from_hidden` and `from_targets`,
  // whose first row is row `base`.
  auto add_chunks = [&](int64_t begin, int64_t end, const at::Tensor& from_hidden, const at::Tensor& from_targets,
                        int64_t base) {
    for (int64_t r0 = begin; r0 < end; r0 += chunk_rows) {
      Chunk c{r0, std::min(chunk_rows, end - r0)};
      c.hidden = from_hidden.narrow(0, r0 - base, c.k);
      c.targets = from_targets.narrow(0, r0 - base, c.k);
      c.mine = c.targets.ge(held_.full_lo).logical_and(c.targets.lt(held_.full_hi));
      c.index = at::where(c.mine, c.targets - held_.full_lo, at::zeros_like(c.targets)).unsqueeze(1);
      chunks.push_back(std::move(c));
    }
  };
  std::vector<at::Tensor> kept;  // chunks[i]'s logits (keep)
  const at::Tensor stats = at::zeros({rows, 2 + cuts}, f32);
  auto chunk_stats = [&](size_t from) {
    for (size_t i = from; i < chunks.size(); ++i) {
      const Chunk& c = chunks[i];
      const at::Tensor s = stats.narrow(0, c.r0, c.k);
      if (vr == 0) {
        s.select(1, 0).fill_(-std::numeric_limits<float>::infinity());
        continue;
      }
      at::Tensor logits = WholeRowLogits(c.hidden, held);
      s.select(1, 0).copy_(at::logsumexp(logits, {1}));
      s.select(1, 1).copy_(at::where(c.mine, logits.gather(1, c.index).squeeze(1), at::zeros({c.k}, f32)));
      if (keep) kept.push_back(std::move(logits));
    }
  };
  add_chunks(own0, own0 + n, own_hidden, own_targets, own0);
  chunk_stats(0);
  SL_RETURN_IF_ERROR(group.ShardStage(gather));
  issue_first();
  // [lo, hi): the rows here before the last stage ends (the replicas' R n
  // tokens of this shard rank's, over the world).
  const int64_t lo = own0 - (position_ % replicas_) * n, hi = lo + replicas_ * n;
  if (replicas_ > 1) {
    const at::Tensor staged_hidden = gather.staged[0].view({replicas_ * n, C}), staged_targets = gather.staged[1];
    const size_t from = chunks.size();
    add_chunks(lo, own0, staged_hidden, staged_targets, lo);
    add_chunks(own0 + n, hi, staged_hidden, staged_targets, lo);
    chunk_stats(from);
  }
  const size_t from = chunks.size();
  SL_RETURN_IF_ERROR(group.Finish(gather));
  add_chunks(0, lo, all_hidden, all_targets, 0);
  add_chunks(hi, rows, all_hidden, all_targets, 0);
  chunk_stats(from);
  std::vector<at::Tensor> part_values;  // held_.parts' elements, fp32
  for (size_t i = 0; i < held_.parts.size(); ++i) {
    const TableShard::PartRow& p = held_.parts[i];
    part_values.push_back(table_part.narrow(0, p.at, p.width).to(at::kFloat));
    stats.select(1, 2 + part_index_[i])
        .copy_(at::mv(all_hidden.narrow(1, p.column, p.width).to(at::kFloat), part_values.back()));
  }

  // 3. Every rank's statistics: each token's logsumexp and target logit.
  const at::Tensor all_stats = at::empty({g, rows, 2 + cuts}, f32);
  if (replicas_ == 1) {
    std::shared_ptr<comm::Work> gather_stats = shard.AllGather(all_stats.view({-1}), stats.view({-1}));
    if (train && issue) issue(std::numeric_limits<int>::max());
    SL_RETURN_IF_ERROR(waiter.OnDevice(*gather_stats, comm::Op::kAllGather));
  } else {
    // (Two stages: the rest of the caller's queue behind the second.)
    SL_RETURN_IF_ERROR(group.AllGather({{all_stats.view({-1}), stats.view({-1})}}));
    if (train && issue) issue(std::numeric_limits<int>::max());
  }
  const at::Tensor cut_logits = all_stats.narrow(2, 2, cuts).sum(0);  // [rows, cuts]
  const at::Tensor lse = at::logsumexp(at::cat({all_stats.select(2, 0).t(), cut_logits}, 1), {1});
  at::Tensor picked = all_stats.select(2, 1).sum(0);  // one rank's logit, zeros
  at::Tensor cut_index, is_cut;                       // the target's column in cut_logits, and whether it is one
  if (cuts > 0) {
    const at::Tensor cut_rows = at::tensor(cut_rows_, at::kLong).to(all_targets.device());
    cut_index = at::searchsorted(cut_rows, all_targets).clamp_max_(cuts - 1).unsqueeze(1);
    is_cut = cut_rows.index_select(0, cut_index.squeeze(1)).eq(all_targets);
    picked = picked + at::where(is_cut, cut_logits.gather(1, cut_index).squeeze(1), at::zeros_like(picked));
  }
  const at::Tensor valid = all_targets.ne(kIgnoreIndex);
  Result r;
  r.loss = at::where(valid, lse - picked, at::zeros_like(lse)).narrow(0, position_ * n, n).sum().mul_(scale);
  if (!train) return r;

  // 4. dL/dlogits = (softmax - onehot(target)) * scale on counted tokens, in
  // the compute dtype; from it dL/dh (this rank's share, every token) and
  // the gradient of the rows held.
  const at::Tensor coef = valid.to(at::kFloat).mul_(scale).unsqueeze(1);
  auto logit_grad = [&](at::Tensor logits, const at::Tensor& rows_lse, const at::Tensor& index,
                        const at::Tensor& hit) {
    at::Tensor d = logits.sub_(rows_lse.unsqueeze(1)).exp_();
    d.scatter_add_(1, index, hit.to(at::kFloat).neg().unsqueeze(1));
    return d;
  };
  const at::Tensor dh = at::zeros({rows, C}, f32);
  at::Tensor row_grad = want.grad_table && vr > 0 ? at::zeros({vr, C}, f32) : at::Tensor();
  std::vector<at::Tensor> kept_grads;  // chunks[i]'s dL/dlogits (keep), for the rows' gradient after dL/dh is sent
  for (size_t i = 0; i < chunks.size() && vr > 0; ++i) {
    const Chunk& c = chunks[i];
    at::Tensor logits = keep ? std::move(kept[i]) : WholeRowLogits(c.hidden, held);
    at::Tensor d = logit_grad(std::move(logits), lse.narrow(0, c.r0, c.k), c.index, c.mine);
    const at::Tensor dc = d.mul_(coef.narrow(0, c.r0, c.k)).to(hidden.scalar_type());
    dh.narrow(0, c.r0, c.k).add_(at::mm(dc, held));
    if (!row_grad.defined()) continue;
    if (keep) {
      kept_grads.push_back(dc);
    } else {
      row_grad.add_(at::mm(dc.t(), c.hidden));
    }
  }
  std::vector<at::Tensor> part_grads;
  if (!held_.parts.empty()) {
    // Every rank has each cut row's whole logit; it adds its elements' terms.
    const at::Tensor d =
        logit_grad(cut_logits.clone(), lse, cut_index, is_cut).mul_(coef).to(hidden.scalar_type()).to(at::kFloat);
    for (size_t i = 0; i < held_.parts.size(); ++i) {
      const TableShard::PartRow& p = held_.parts[i];
      const at::Tensor dp = d.select(1, part_index_[i]);
      dh.narrow(1, p.column, p.width).add_(at::outer(dp, part_values[i]));
      if (want.grad_table) {
        part_grads.push_back(at::mv(all_hidden.narrow(1, p.column, p.width).to(at::kFloat).t(), dp));
      }
    }
  }
  // dL/dh of this rank's tokens: every rank's share, summed.
  const at::Tensor send = dh.to(want.reduce_dtype).view({-1});
  const at::Tensor own = at::empty({n * C}, send.options());
  std::shared_ptr<comm::Work> scatter;
  if (want.grad_hidden) {
    SL_ASSIGN_OR_RETURN(scatter, group.ReduceScatter(own, send));
  }
  if (want.grad_table) {
    for (size_t i = 0; i < kept_grads.size(); ++i) row_grad.add_(at::mm(kept_grads[i].t(), chunks[i].hidden));
    at::Tensor grad = at::zeros({part_numel_}, f32);
    if (row_grad.defined()) grad.narrow(0, held_.full_at, vr * C).copy_(row_grad.view({-1}));
    for (size_t i = 0; i < part_grads.size(); ++i) {
      grad.narrow(0, held_.parts[i].at, held_.parts[i].width).copy_(part_grads[i]);
    }
    r.grad_table = grad.to(want.reduce_dtype);
  }
  if (scatter) {
    SL_RETURN_IF_ERROR(waiter.OnDevice(*scatter, comm::Op::kReduceScatter));
    r.grad_hidden = own.view({n, C}).to(hidden.scalar_type());
  }
  return r;
}

}  // namespace shardline
