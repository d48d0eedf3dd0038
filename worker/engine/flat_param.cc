#include "worker/engine/flat_param.h"

#include "absl/strings/str_cat.h"
#include "worker/engine/adamw_8bit.h"
#include "common/base/status_macros.h"
#include "worker/engine/storage_views.h"

namespace shardline {

const char* MemKindName(MemKind k) {
  switch (k) {
    case MemKind::kParams: return "params";
    case MemKind::kGrads: return "grads";
    case MemKind::kMaster: return "master";
    case MemKind::kOptimizer: return "optimizer";
    case MemKind::kActivations: return "activations";
  }
  return "?";
}

void MemoryLedger::Add(MemKind k, int64_t bytes) {
  const int i = static_cast<int>(k);
  current_[i] += bytes;
  peak_by_kind_[i] = std::max(peak_by_kind_[i], current_[i]);
  total_ += bytes;
  peak_ = std::max(peak_, total_);
}


at::Tensor FlatParam::NewTensor(int64_t numel, at::ScalarType dtype, MemKind kind) {
  at::Tensor t = device_.Empty(numel, dtype);
  ledger_->Add(kind, t.nbytes());
  return t;
}

absl::StatusOr<std::unique_ptr<FlatParam>> FlatParam::Create(ShardLayout layout, int shard_rank,
                                                             const FlatParamOptions& options, const Device& device,
                                                             MemoryLedger* ledger, const InitValues& init) {
  std::unique_ptr<FlatParam> p(new FlatParam(std::move(layout), shard_rank, options, device, ledger));
  SL_RETURN_IF_ERROR(p->LoadInitial(init));
  if (!options.persistent_params) p->FreeUnsharded();
  if (!options.persistent_grads) p->FreeGrad();
  return p;
}

InitValues FlatParam::ValuesOf(at::Tensor full) {
  return [full = full.to(at::kFloat).contiguous()](int64_t begin, at::Tensor out) {
    out.zero_();
    const int64_t n = std::min(out.numel(), full.numel() - begin);
    if (n > 0) out.narrow(0, 0, n).copy_(full.narrow(0, begin, n));
    return absl::OkStatus();
  };
}

FlatParam::FlatParam(ShardLayout layout, int shard_rank, const FlatParamOptions& options, const Device& device,
                     MemoryLedger* ledger)
    : layout_(std::move(layout)), shard_rank_(shard_rank), options_(options), device_(device), ledger_(ledger) {
  const int64_t shard = layout_.shard_numel, padded = layout_.padded_numel;
  const bool trainable = options_.trainable;
  // Leaves and grad views are made while the storages hold memory (Create
  // frees what does not persist once the values are in).
  unsharded_ = NewTensor(padded, options_.param_dtype, MemKind::kParams);
  if (trainable) {
    grad_full_ = NewTensor(padded, options_.param_dtype, MemKind::kGrads);
    grad_full_.zero_();
  }
  for (const ParamSlot& slot : layout_.params) {
    at::Tensor w = StorageView(unsharded_, slot.offset, slot.spec.shape);
    if (trainable) {
      w.requires_grad_(true);
      w.mutable_grad() = StorageView(grad_full_, slot.offset, slot.spec.shape);
    }
    weights_.push_back(std::move(w));
  }
  state_ = options_.persistent_params ? UnshardState::kUnsharded : UnshardState::kSharded;
  if (!trainable) {
    if (!options_.persistent_params) param_shard_ = NewTensor(shard, options_.param_dtype, MemKind::kParams);
    return;
  }
  const int pieces = options_.optimizer_shards;
  owned_numel_ = (shard + pieces - 1) / pieces;
  owned_offset_ = options_.optimizer_rank * owned_numel_;
  if (options_.moments_dtype == at::kByte) {
    optimizer_ = std::make_unique<AdamW8BitState>(
        layout_, layout_.ShardOffset(shard_rank_) + owned_offset_, owned_numel_,
        [this](int64_t numel, at::ScalarType dtype) { return NewTensor(numel, dtype, MemKind::kOptimizer).zero_(); });
  } else {
    at::Tensor exp_avg = NewTensor(owned_numel_, options_.moments_dtype, MemKind::kOptimizer).zero_();
    at::Tensor exp_avg_sq = NewTensor(owned_numel_, options_.moments_dtype, MemKind::kOptimizer).zero_();
    optimizer_ = std::make_unique<DenseAdamWState>(std::move(exp_avg), std::move(exp_avg_sq),
                                                   OwnedDecayRanges(DecayRanges(layout_, shard_rank_)));
  }
  // Where the master would hold the parameters' own values (fp32 parameters,
  // or bf16 ones updated in place) it is this rank's chunk of the parameters
  // themselves (ZeRO 0-2) or the parameter shard (ZeRO-3), as DDP and
  // DeepSpeed do without mixed precision and torch.optim.AdamW does on bf16.
  const bool master_is_params = options_.master_dtype == options_.param_dtype;
  if (replica_sharded()) {
    AllocReplicaPieces();
  } else if (master_is_params && options_.persistent_params) {
    master_ = OwnChunk(unsharded_);
  } else {
    master_ = NewTensor(shard, options_.master_dtype, MemKind::kMaster);
  }
  if (!options_.persistent_params && !param_shard_.defined()) {
    param_shard_ = master_is_params ? master_ : NewTensor(shard, options_.param_dtype, MemKind::kParams);
  }
  // The optimizer reads grad_shard (replica-sharded: grad_owned). Where
  // grad_full persists in the reduce dtype, the reduce-scatter leaves the
  // result in grad_full's own chunk.
  if (replica_sharded()) {
    // (grad_shard was set with the pieces.)
  } else if (options_.persistent_grads && options_.reduce_dtype == options_.param_dtype) {
    grad_shard_ = OwnChunk(grad_full_);
  } else {
    grad_shard_ = NewTensor(shard, options_.reduce_dtype, MemKind::kGrads).zero_();
  }
}

absl::Status FlatParam::LoadInitial(const InitValues& init) {
  const int64_t shard_begin = layout_.ShardOffset(shard_rank_), shard = layout_.shard_numel;
  const bool whole = options_.persistent_params;
  const int64_t begin = whole ? 0 : shard_begin, end = whole ? layout_.padded_numel : shard_begin + shard;
  at::Tensor chunk = at::empty({std::max<int64_t>(0, std::min(kInitChunk, end - begin))}, at::kFloat);
  for (int64_t b = begin; b < end; b += chunk.numel()) {
    const int64_t n = std::min(chunk.numel(), end - b);
    at::Tensor values = chunk.narrow(0, 0, n);
    SL_RETURN_IF_ERROR(init(b, values));
    if (whole) unsharded_.narrow(0, b, n).copy_(values);
    const int64_t lo = std::max(b, shard_begin), hi = std::min(b + n, shard_begin + shard);
    if (lo < hi) CopyIntoShard(lo - shard_begin, values.narrow(0, lo - b, hi - lo));
  }
  return absl::OkStatus();
}

void FlatParam::CopyIntoShard(int64_t at, const at::Tensor& values) {
  // `dst` holds the shard's [dst_begin, dst_begin + dst.numel()).
  auto copy_overlap = [&](const at::Tensor& dst, int64_t dst_begin) {
    const int64_t lo = std::max(at, dst_begin), hi = std::min(at + values.numel(), dst_begin + dst.numel());
    if (lo < hi) dst.narrow(0, lo - dst_begin, hi - lo).copy_(values.narrow(0, lo - at, hi - lo));
  };
  if (param_shard_.defined()) copy_overlap(param_shard_, 0);
  // The master from the fp32 values, not from their param-dtype rounding;
  // where it aliases the parameters it was written with them.
  if (!master_.defined()) return;
  const bool aliased = (param_shard_.defined() && master_.is_alias_of(param_shard_)) ||
                       (options_.persistent_params && master_.is_alias_of(unsharded_));
  if (!aliased) copy_overlap(master_, owned_offset_);
}

std::vector<DecayRange> FlatParam::OwnedDecayRanges(const std::vector<DecayRange>& in_shard) const {
  std::vector<DecayRange> out;
  for (const DecayRange& r : in_shard) {
    const int64_t b = std::max(r.begin, owned_offset_), e = std::min(r.end, owned_offset_ + owned_numel_);
    if (b < e) out.push_back({b - owned_offset_, e - owned_offset_});
  }
  return out;
}

void FlatParam::AllocReplicaPieces() {
  const int64_t shard = layout_.shard_numel, all = owned_numel_ * options_.optimizer_shards;
  // The pieces past the shard's end (up to R pieces) stay zero.
  param_pieces_ = NewTensor(all, options_.param_dtype, MemKind::kParams).zero_();
  param_shard_ = param_pieces_.narrow(0, 0, shard);
  if (options_.master_dtype == options_.param_dtype) {
    master_ = param_pieces_.narrow(0, owned_offset_, owned_numel_);
  } else {
    master_ = NewTensor(owned_numel_, options_.master_dtype, MemKind::kMaster).zero_();
  }
  grad_pieces_ = NewTensor(all, options_.reduce_dtype, MemKind::kGrads).zero_();
  grad_shard_ = grad_pieces_.narrow(0, 0, shard);
  // The replicas' reduce-scatter leaves this rank's piece in place.
  grad_owned_ = grad_pieces_.narrow(0, owned_offset_, owned_numel_);
}

FlatParam::~FlatParam() {
  // An all-gather still in flight writes into the buffer: it is left to its
  // Work (which the communicator's teardown ends) rather than freed under it.
  if (state_ != UnshardState::kGathering) FreeUnsharded();
  FreeGrad();
}

void FlatParam::AllocUnsharded() {
  if (unsharded_allocated()) return;
  // The storage's allocator allocates on the current stream: the compute
  // stream, which the step thread holds current.
  ReacquireStorage(unsharded_, layout_.padded_numel * unsharded_.element_size());
  ledger_->Add(MemKind::kParams, unsharded_.nbytes());
}

void FlatParam::FreeUnsharded() {
  if (!unsharded_allocated()) return;
  ledger_->Sub(MemKind::kParams, unsharded_.nbytes());
  ReleaseStorage(unsharded_);
}

void FlatParam::Unshard(comm::Communicator& shard_group) {
  if (state_ != UnshardState::kSharded) return;
  AllocUnsharded();
  if (replica_gather_) {
    // The pieces' gather is kept until this one was waited for.
    gather_ = shard_group.AllGatherAfter(unsharded_, param_shard_, replica_gather_);
    gather_after_ = std::move(replica_gather_);
  } else {
    gather_ = shard_group.AllGather(unsharded_, param_shard_);
  }
  state_ = UnshardState::kGathering;
}

void FlatParam::GatherOverReplicas(comm::Communicator& replicate) {
  if (!replica_sharded()) return;
  replica_gather_ = replicate.AllGather(param_pieces_, param_pieces_.narrow(0, owned_offset_, owned_numel_));
}

absl::Status FlatParam::WaitForReplicaGather(CommWaiter& waiter) {
  std::shared_ptr<comm::Work> w = std::move(replica_gather_);
  replica_gather_.reset();
  return w ? waiter.OnDevice(*w, comm::Op::kAllGather) : absl::OkStatus();
}

at::Tensor FlatParam::ReplicaReduceInput() {
  const int64_t shard = layout_.shard_numel;
  if (grad_pieces_.numel() > shard) grad_pieces_.narrow(0, shard, grad_pieces_.numel() - shard).zero_();
  return grad_pieces_;
}

absl::Status FlatParam::WaitForUnshard(CommWaiter& waiter) {
  if (state_ == UnshardState::kUnsharded) return absl::OkStatus();
  if (state_ == UnshardState::kSharded) {
    return absl::FailedPreconditionError(absl::StrCat(layout_.unit, ": wait for an unshard that was never started"));
  }
  absl::Status s = waiter.OnDevice(*gather_, comm::Op::kAllGather);
  gather_.reset();
  gather_after_.reset();
  // A failed gather leaves garbage: the buffer is freed and the unit is
  // sharded again (the communicator is aborted; the step fails).
  if (!s.ok()) {
    FreeUnsharded();
    state_ = UnshardState::kSharded;
    return s;
  }
  state_ = UnshardState::kUnsharded;
  return absl::OkStatus();
}

absl::Status FlatParam::Reshard() {
  if (options_.persistent_params || state_ == UnshardState::kSharded) return absl::OkStatus();
  if (state_ == UnshardState::kGathering) {
    return absl::FailedPreconditionError(
        absl::StrCat(layout_.unit, ": reshard while its all-gather is in flight (its buffer is still being written)"));
  }
  FreeUnsharded();
  state_ = UnshardState::kSharded;
  return absl::OkStatus();
}

void FlatParam::EnsureGrad() {
  if (!trainable() || grad_allocated()) return;
  ReacquireStorage(grad_full_, layout_.padded_numel * grad_full_.element_size());
  grad_full_.zero_();
  ledger_->Add(MemKind::kGrads, grad_full_.nbytes());
}

void FlatParam::FreeGrad() {
  if (!grad_allocated()) return;
  ledger_->Sub(MemKind::kGrads, grad_full_.nbytes());
  ReleaseStorage(grad_full_);
}

void FlatParam::ZeroGrad() {
  if (!trainable()) return;
  if (options_.persistent_grads) {
    grad_full_.zero_();
  } else {
    FreeGrad();
  }
}

void FlatParam::OptimizerStep(const AdamWStep& s, const at::Tensor& clip_coef) {
  if (!trainable()) return;
  optimizer_->Update(s, master_, optimizer_grad(), clip_coef);
  PublishMaster();
}

absl::Status FlatParam::LoadState(const at::Tensor& master, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                                  const AdamWState::Encoded& encoded) {
  if (!trainable()) return absl::OkStatus();
  master_.copy_(master);
  optimizer_->Load(exp_avg, exp_avg_sq);
  if (!encoded.empty() && !optimizer_->LoadEncoded(encoded)) {
    return absl::InvalidArgumentError(absl::StrCat(layout_.unit, ": the saved moments' codes do not fit this shard"));
  }
  return absl::OkStatus();
}

void FlatParam::PublishMaster() {
  if (!trainable()) return;
  at::Tensor target = replica_sharded()        ? param_pieces_.narrow(0, owned_offset_, owned_numel_)
                      : param_shard_.defined() ? param_shard_
                                               : OwnChunk(unsharded_);
  if (target.data_ptr() != master_.data_ptr()) target.copy_(master_);
}

}  // namespace shardline
