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
  at::Tensor logits;   // [k, full rows] fp32, kept from the statistics for the gradient (Pass::keep_)
  at::Tensor grad;     // its dL/dlogits, kept for the rows' gradient until dL/dh is sent
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

  absl::Status Wait(comm::Work& work, comm::Op op) { return waiter_.OnDevice(work, op); }

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

// One Run: steps 1 and 2 (Statistics), then 3 and 4 half by half (Finish).
// The statistics are exchanged in two halves of the group's tokens (split
// at a rank's boundary), each issued once this rank has computed it, the
// first always first: the first half's exchange runs, and the ranks' skew
// in reaching it hides, while the second half computes; the second's while
// the first half's gradient computes.
class VocabParallelHead::Pass {
 public:
  Pass(const VocabParallelHead& head, Group& group, const at::Tensor& hidden, const at::Tensor& targets,
       const at::Tensor& table_part, double scale, const Want& want, const std::function<void(int)>& issue)
      : head_(head),
        group_(group),
        want_(want),
        issue_(issue),
        scale_(scale),
        train_(want.grad_hidden || want.grad_table),
        g_(group.size()),
        n_(hidden.size(0)),
        C_(head.width_),
        rows_(g_ * n_),
        cuts_(static_cast<int64_t>(head.cut_rows_.size())),
        vr_(head.held_.full_rows()),
        own0_(head.position_ * n_),
        dtype_(hidden.scalar_type()),
        f32_(hidden.options().dtype(at::kFloat)) {
    own_hidden_ = hidden.detach().contiguous();
    own_targets_ = targets.reshape({-1}).to(at::kLong).contiguous();
    all_hidden_ = at::empty({rows_, C_}, hidden.options());
    all_targets_ = at::empty({rows_}, own_targets_.options());
    if (vr_ > 0) held_rows_ = table_part.narrow(0, head.held_.full_at, vr_ * C_).view({vr_, C_});
    for (const auto& p : head.held_.parts) part_values_.push_back(table_part.narrow(0, p.at, p.width).to(at::kFloat));
    chunk_rows_ =
        want.chunk_rows > 0 ? want.chunk_rows : std::max<int64_t>(1, kChunkLogits / std::max<int64_t>(1, vr_));
    // Where every token's logits fit in one chunk's budget they are all
    // kept for the gradient; else each chunk's are computed again.
    keep_ = rows_ <= chunk_rows_;
    stats_ = at::zeros({rows_, 2 + cuts_}, f32_);
    lse_ = at::empty({rows_}, f32_);
    picked_ = at::empty({rows_}, f32_);
    cut_logits_ = at::empty({rows_, cuts_}, f32_);
    const int64_t mid = g_ / 2 * n_;
    if (mid > 0) halves_.push_back(Half{0, mid});
    halves_.push_back(Half{mid, rows_});
  }

  // 1 and 2: every rank's hidden states and targets gathered while this
  // rank's own tokens' statistics compute (over the world, its own while the
  // stage across the replicas runs, its replicas' while the shard group's
  // runs), then every other token's; each half's exchange (3) issued as
  // soon as it is computed.
  absl::Status Statistics() {
    Group::Gather gather =
        group_.StartAllGather({{all_hidden_.view({-1}), own_hidden_.view({-1})}, {all_targets_, own_targets_}});
    if (gather.sharded) IssueFirst();
    Compute(own0_, own0_ + n_, own_hidden_, own_targets_, own0_);
    SL_RETURN_IF_ERROR(group_.ShardStage(gather));
    IssueFirst();
    // [lo, hi): the rows here before the last stage ends (the replicas' R n
    // tokens of this shard rank's, over the world).
    const int R = head_.replicas_;
    const int64_t lo = own0_ - (head_.position_ % R) * n_, hi = lo + R * n_;
    if (R > 1) {
      const at::Tensor staged = gather.staged[0].view({R * n_, C_});
      Compute(lo, own0_, staged, gather.staged[1], lo);
      Compute(own0_ + n_, hi, staged, gather.staged[1], lo);
    }
    SL_RETURN_IF_ERROR(group_.Finish(gather));
    Compute(0, lo, all_hidden_, all_targets_, 0);
    Compute(hi, rows_, all_hidden_, all_targets_, 0);
    // (Over the world: the rest of the caller's queue behind the second stages.)
    for (Half& h : halves_) SL_RETURN_IF_ERROR(group_.ShardStage(h.exchange));
    if (train_ && issue_) issue_(std::numeric_limits<int>::max());
    return absl::OkStatus();
  }

  // 3 and 4: each half's tokens' loss terms once its exchange is in, and in
  // training their gradients; then dL/dh reduce-scattered and the rows'
  // gradient.
  absl::StatusOr<Result> Finish() {
    valid_ = all_targets_.ne(kIgnoreIndex);
    coef_ = valid_.to(at::kFloat).mul_(scale_).unsqueeze(1);
    if (cuts_ > 0) {
      cut_rows_ = at::tensor(head_.cut_rows_, at::kLong).to(all_targets_.device());
      cut_index_ = at::empty({rows_, 1}, all_targets_.options());
      is_cut_ = at::empty({rows_}, all_targets_.options().dtype(at::kBool));
    }
    if (train_) {
      dh_ = at::zeros({rows_, C_}, f32_);
      if (want_.grad_table && vr_ > 0) row_grad_ = at::zeros({vr_, C_}, f32_);
    }
    for (Half& h : halves_) {
      SL_RETURN_IF_ERROR(FinishHalf(h));
      if (train_) HalfGradients(h);
    }
    Result r;
    r.loss = at::where(valid_, lse_ - picked_, at::zeros_like(lse_)).narrow(0, own0_, n_).sum().mul_(scale_);
    if (!train_) return r;
    SL_RETURN_IF_ERROR(Gradients(&r));
    return r;
  }

 private:
  struct Half {
    int64_t begin, end;
    int64_t computed = 0;  // rows whose statistics are in stats_
    at::Tensor all_stats;  // [g, end - begin, 2 + cuts]
    Group::Gather exchange;
  };

  void IssueFirst() {
    if (train_ && issue_ && !first_issued_) issue_(1);
    first_issued_ = true;
  }

  // Statistics of rows [begin, end), read from `from_hidden` and
  // `from_targets` whose first row is row `base`, in chunks inside a half.
  void Compute(int64_t begin, int64_t end, const at::Tensor& from_hidden, const at::Tensor& from_targets,
               int64_t base) {
    for (int64_t r0 = begin; r0 < end;) {
      Half& half = r0 < halves_.front().end ? halves_.front() : halves_.back();
      Chunk c{r0, std::min({chunk_rows_, end - r0, half.end - r0})};
      c.hidden = from_hidden.narrow(0, r0 - base, c.k);
      c.targets = from_targets.narrow(0, r0 - base, c.k);
      c.mine = c.targets.ge(head_.held_.full_lo).logical_and(c.targets.lt(head_.held_.full_hi));
      c.index = at::where(c.mine, c.targets - head_.held_.full_lo, at::zeros_like(c.targets)).unsqueeze(1);
      ChunkStatistics(c);
      half.computed += c.k;
      r0 += c.k;
      chunks_.push_back(std::move(c));
      IssueComputedExchanges();
    }
  }

  // [logsumexp of its whole rows, its target logits, its elements' share
  // of each cut row's logit] for c's tokens.
  void ChunkStatistics(Chunk& c) {
    const at::Tensor s = stats_.narrow(0, c.r0, c.k);
    for (size_t i = 0; i < head_.held_.parts.size(); ++i) {
      const TableShard::PartRow& p = head_.held_.parts[i];
      s.select(1, 2 + head_.part_index_[i])
          .copy_(at::mv(c.hidden.narrow(1, p.column, p.width).to(at::kFloat), part_values_[i]));
    }
    if (vr_ == 0) {
      s.select(1, 0).fill_(-std::numeric_limits<float>::infinity());
      return;
    }
    at::Tensor logits = WholeRowLogits(c.hidden, held_rows_);
    s.select(1, 0).copy_(at::logsumexp(logits, {1}));
    s.select(1, 1).copy_(at::where(c.mine, logits.gather(1, c.index).squeeze(1), at::zeros({c.k}, f32_)));
    if (keep_) c.logits = std::move(logits);
  }

  // Issues each computed half's exchange, in order (the same on every rank).
  void IssueComputedExchanges() {
    for (; next_half_ < halves_.size(); ++next_half_) {
      Half& h = halves_[next_half_];
      if (h.computed < h.end - h.begin) return;
      h.all_stats = at::empty({g_, h.end - h.begin, 2 + cuts_}, f32_);
      const at::Tensor mine = stats_.narrow(0, h.begin, h.end - h.begin).view({-1});
      h.exchange = group_.StartAllGather({{h.all_stats.view({-1}), mine}});
    }
  }

  // 3 for a half: each of its tokens' logsumexp over the vocabulary and
  // target logit, from every rank's statistics.
  absl::Status FinishHalf(Half& h) {
    SL_RETURN_IF_ERROR(group_.Finish(h.exchange));
    const int64_t a = h.begin, k = h.end - h.begin;
    const at::Tensor cut_logits = h.all_stats.narrow(2, 2, cuts_).sum(0);  // [k, cuts]
    cut_logits_.narrow(0, a, k).copy_(cut_logits);
    lse_.narrow(0, a, k).copy_(at::logsumexp(at::cat({h.all_stats.select(2, 0).t(), cut_logits}, 1), {1}));
    at::Tensor picked = h.all_stats.select(2, 1).sum(0);  // one rank's logit, zeros
    if (cuts_ > 0) {
      // The target's column in the cut logits, and whether it is one.
      const at::Tensor targets = all_targets_.narrow(0, a, k);
      const at::Tensor index = at::searchsorted(cut_rows_, targets).clamp_max_(cuts_ - 1).unsqueeze(1);
      const at::Tensor is_cut = cut_rows_.index_select(0, index.squeeze(1)).eq(targets);
      cut_index_.narrow(0, a, k).copy_(index);
      is_cut_.narrow(0, a, k).copy_(is_cut);
      picked = picked + at::where(is_cut, cut_logits.gather(1, index).squeeze(1), at::zeros_like(picked));
    }
    picked_.narrow(0, a, k).copy_(picked);
    return absl::OkStatus();
  }

  // dL/dlogits = (softmax - onehot(target)) * scale on counted tokens.
  static at::Tensor LogitGrad(at::Tensor logits, const at::Tensor& rows_lse, const at::Tensor& index,
                              const at::Tensor& hit) {
    at::Tensor d = logits.sub_(rows_lse.unsqueeze(1)).exp_();
    d.scatter_add_(1, index, hit.to(at::kFloat).neg().unsqueeze(1));
    return d;
  }

  // 4 for a half's chunks: dL/dlogits in the compute dtype, and from it
  // this rank's share of dL/dh and (past the keep budget) the rows'
  // gradient; kept, that waits until dL/dh is sent.
  void HalfGradients(const Half& h) {
    for (Chunk& c : chunks_) {
      if (vr_ == 0 || c.r0 < h.begin || c.r0 >= h.end) continue;
      at::Tensor logits = keep_ ? std::move(c.logits) : WholeRowLogits(c.hidden, held_rows_);
      at::Tensor d = LogitGrad(std::move(logits), lse_.narrow(0, c.r0, c.k), c.index, c.mine);
      const at::Tensor dc = d.mul_(coef_.narrow(0, c.r0, c.k)).to(dtype_);
      dh_.narrow(0, c.r0, c.k).add_(at::mm(dc, held_rows_));
      if (!row_grad_.defined()) continue;
      if (keep_) {
        c.grad = dc;
      } else {
        row_grad_.add_(at::mm(dc.t(), c.hidden));
      }
    }
  }

  // The cut rows' terms of dL/dh, dL/dh of this rank's tokens (every
  // rank's share, summed) and this rank's part of the table's gradient.
  absl::Status Gradients(Result* r) {
    std::vector<at::Tensor> part_grads;
    if (!head_.held_.parts.empty()) {
      // Every rank has each cut row's whole logit; it adds its elements' terms.
      const at::Tensor d =
          LogitGrad(cut_logits_.clone(), lse_, cut_index_, is_cut_).mul_(coef_).to(dtype_).to(at::kFloat);
      for (size_t i = 0; i < head_.held_.parts.size(); ++i) {
        const TableShard::PartRow& p = head_.held_.parts[i];
        const at::Tensor dp = d.select(1, head_.part_index_[i]);
        dh_.narrow(1, p.column, p.width).add_(at::outer(dp, part_values_[i]));
        if (want_.grad_table) {
          part_grads.push_back(at::mv(all_hidden_.narrow(1, p.column, p.width).to(at::kFloat).t(), dp));
        }
      }
    }
    const at::Tensor send = dh_.to(want_.reduce_dtype).view({-1});
    const at::Tensor own = at::empty({n_ * C_}, send.options());
    std::shared_ptr<comm::Work> scatter;
    if (want_.grad_hidden) {
      SL_ASSIGN_OR_RETURN(scatter, group_.ReduceScatter(own, send));
    }
    if (want_.grad_table) {
      for (const Chunk& c : chunks_) {
        if (c.grad.defined()) row_grad_.add_(at::mm(c.grad.t(), c.hidden));
      }
      at::Tensor grad = at::zeros({head_.part_numel_}, f32_);
      if (row_grad_.defined()) grad.narrow(0, head_.held_.full_at, vr_ * C_).copy_(row_grad_.view({-1}));
      for (size_t i = 0; i < part_grads.size(); ++i) {
        grad.narrow(0, head_.held_.parts[i].at, head_.held_.parts[i].width).copy_(part_grads[i]);
      }
      r->grad_table = grad.to(want_.reduce_dtype);
    }
    if (scatter) {
      SL_RETURN_IF_ERROR(group_.Wait(*scatter, comm::Op::kReduceScatter));
      r->grad_hidden = own.view({n_, C_}).to(dtype_);
    }
    return absl::OkStatus();
  }

  const VocabParallelHead& head_;
  Group& group_;
  const Want& want_;
  const std::function<void(int)>& issue_;
  const double scale_;
  const bool train_;
  const int64_t g_, n_, C_, rows_, cuts_, vr_, own0_;
  const at::ScalarType dtype_;
  const at::TensorOptions f32_;
  int64_t chunk_rows_ = 0;
  bool keep_ = false;
  bool first_issued_ = false;  // the caller's first collective, queued behind the shard group's stage
  at::Tensor own_hidden_, own_targets_, all_hidden_, all_targets_;
  at::Tensor held_rows_;                // [vr, C]: the whole rows held
  std::vector<at::Tensor> part_values_;  // held_.parts' elements, fp32
  std::vector<Chunk> chunks_;
  std::vector<Half> halves_;
  size_t next_half_ = 0;  // the first half whose exchange is not issued
  at::Tensor stats_;      // [rows, 2 + cuts]: this rank's
  at::Tensor lse_, picked_, cut_logits_, cut_index_, is_cut_, cut_rows_;
  at::Tensor valid_, coef_, dh_, row_grad_;
};

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
  Pass pass(*this, group, hidden, targets, table_part, scale, want, issue);
  SL_RETURN_IF_ERROR(pass.Statistics());
  return pass.Finish();
}

}  // namespace shardline
