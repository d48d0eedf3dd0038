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

  // Each pair's own [m] into out [size * m], in position order: across the
  // replicas first (a rank's own tokens cross the link between shard groups
  // once), then their R m over the shard group.
  absl::Status AllGather(const std::vector<std::pair<at::Tensor, at::Tensor>>& out_own) {
    std::vector<at::Tensor> own;
    std::vector<std::shared_ptr<comm::Work>> works;
    for (const auto& [out, mine] : out_own) {
      at::Tensor in = mine;
      if (replicas_) {
        in = at::empty({replicas_->size() * mine.numel()}, mine.options());
        works.push_back(replicas_->AllGather(in, mine));
      }
      own.push_back(in);
    }
    SL_RETURN_IF_ERROR(WaitAll(works, comm::Op::kAllGather));
    for (size_t i = 0; i < out_own.size(); ++i) works.push_back(shard_.AllGather(out_own[i].first, own[i]));
    return WaitAll(works, comm::Op::kAllGather);
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
  absl::Status WaitAll(std::vector<std::shared_ptr<comm::Work>>& works, comm::Op op) {
    for (const auto& w : std::exchange(works, {})) SL_RETURN_IF_ERROR(waiter_.OnDevice(*w, op));
    return absl::OkStatus();
  }

  comm::Communicator& shard_;
  comm::Communicator* const replicas_;
  CommWaiter& waiter_;
  // The reduce-scatter's first stage, read by the second until the caller
  // waits for it: freed with the group, after that wait.
  at::Tensor staged_;
};

at::Tensor VocabParallelHead::WholeRowLogits(const at::Tensor& all_hidden, const at::Tensor& held, int64_t r0,
                                             int64_t k) const {
  return at::linear(all_hidden.narrow(0, r0, k), held).to(at::kFloat);
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
  // 1. Every rank's hidden states and targets.
  const at::Tensor own_hidden = hidden.detach().contiguous();
  const at::Tensor own_targets = targets.reshape({-1}).to(at::kLong).contiguous();
  const at::Tensor all_hidden = at::empty({rows, C}, hidden.options());
  const at::Tensor all_targets = at::empty({rows}, own_targets.options());
  SL_RETURN_IF_ERROR(group.AllGather({{all_hidden.view({-1}), own_hidden.view({-1})}, {all_targets, own_targets}}));
  const bool train = want.grad_hidden || want.grad_table;
  if (train && issue) issue(1);  // (sent while 2 computes)

  // 2. This rank's statistics: [logsumexp of its whole rows, its target
  // logits, its elements' share of each cut row's logit].
  const at::Tensor held = vr > 0 ? table_part.narrow(0, held_.full_at, vr * C).view({vr, C}) : at::Tensor();
  const int64_t chunk_rows =
      want.chunk_rows > 0 ? want.chunk_rows : std::max<int64_t>(1, kChunkLogits / std::max<int64_t>(1, vr));
  std::vector<Chunk> chunks;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    Chunk c{r0, std::min(chunk_rows, rows - r0)};
    c.targets = all_targets.narrow(0, r0, c.k);
    c.mine = c.targets.ge(held_.full_lo).logical_and(c.targets.lt(held_.full_hi));
    c.index = at::where(c.mine, c.targets - held_.full_lo, at::zeros_like(c.targets)).unsqueeze(1);
    chunks.push_back(std::move(c));
  }
  // One chunk's logits are kept for the gradient; more are computed again.
  at::Tensor kept;
  const at::Tensor stats = at::zeros({rows, 2 + cuts}, f32);
  for (const Chunk& c : chunks) {
    const at::Tensor s = stats.narrow(0, c.r0, c.k);
    if (vr == 0) {
      s.select(1, 0).fill_(-std::numeric_limits<float>::infinity());
      continue;
    }
    at::Tensor logits = WholeRowLogits(all_hidden, held, c.r0, c.k);
    s.select(1, 0).copy_(at::logsumexp(logits, {1}));
    s.select(1, 1).copy_(at::where(c.mine, logits.gather(1, c.index).squeeze(1), at::zeros({c.k}, f32)));
    if (chunks.size() == 1) kept = std::move(logits);
  }
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
  at::Tensor kept_grad;  // one chunk's dL/dlogits, for the rows' gradient after dL/dh is sent
  for (const Chunk& c : chunks) {
    if (vr == 0) break;
    at::Tensor logits = kept.defined() ? kept : WholeRowLogits(all_hidden, held, c.r0, c.k);
    at::Tensor d = logit_grad(std::move(logits), lse.narrow(0, c.r0, c.k), c.index, c.mine);
    const at::Tensor dc = d.mul_(coef.narrow(0, c.r0, c.k)).to(hidden.scalar_type());
    dh.narrow(0, c.r0, c.k).add_(at::mm(dc, held));
    if (!row_grad.defined()) continue;
    if (chunks.size() == 1) {
      kept_grad = dc;
    } else {
      row_grad.add_(at::mm(dc.t(), all_hidden.narrow(0, c.r0, c.k)));
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
    if (kept_grad.defined()) row_grad.add_(at::mm(kept_grad.t(), all_hidden));
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
