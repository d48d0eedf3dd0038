#include "worker/engine/nf4_base.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/storage_views.h"

namespace shardline {

namespace {

Nf4Layout LayoutOf(const std::vector<Nf4Base::Matrix>& matrices, int group_size) {
  std::vector<int64_t> numels;
  for (const Nf4Base::Matrix& m : matrices) numels.push_back(m.spec.numel());
  return MakeNf4Layout(numels, group_size);
}

}  // namespace

Nf4Base::Nf4Base(std::string unit, std::vector<Matrix> matrices, const std::vector<Nf4Tensor>& quantized,
                 int group_size, int shard_rank, at::ScalarType param_dtype, const Device& device,
                 MemoryLedger* ledger)
    : unit_(std::move(unit)), matrices_(std::move(matrices)), layout_(LayoutOf(matrices_, group_size)),
      device_(device), ledger_(ledger), tables_(device.device()) {
  // Each matrix's blocks into the unit's image on the host.
  const int64_t G = group_size, P = layout_.piece_blocks, C = Nf4Layout::kCodeBytes;
  at::Tensor codes = at::zeros({G * P * C}, at::kByte), qabsmax = at::zeros({G * P}, at::kByte);
  at::Tensor absmax2 = at::empty({layout_.scales}, at::kFloat);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const Nf4Placement& p = layout_.matrices[i];
    const Nf4Tensor& q = quantized[i];
    codes.narrow(0, p.first_block * C, q.packed.numel()).copy_(q.packed);
    qabsmax.narrow(0, p.first_block, p.blocks).copy_(q.qabsmax);
    absmax2.narrow(0, p.first_scale, p.scales).copy_(q.absmax2);
    offsets_.push_back(q.offset);
  }
  const at::Tensor mine = at::cat({codes.narrow(0, shard_rank * P * C, P * C), qabsmax.narrow(0, shard_rank * P, P)});
  piece_ = device_.Empty(mine.numel(), at::kByte);
  piece_.copy_(mine);
  absmax2_ = device_.Empty(layout_.scales, at::kFloat);
  absmax2_.copy_(absmax2);
  ledger_->Add(MemKind::kParams, layout_.resident_bytes());
  // The views are made while the storage holds memory; it is released until
  // the first use.
  unsharded_ = device_.Empty(layout_.numel, param_dtype);
  ledger_->Add(MemKind::kParams, unsharded_.nbytes());
  for (size_t i = 0; i < matrices_.size(); ++i) {
    weights_.push_back(StorageView(unsharded_, layout_.matrices[i].value_offset, matrices_[i].spec.shape));
  }
  FreeUnsharded();
}

Nf4Base::~Nf4Base() {
  // A gather still in flight writes into `gathered`, which its Work holds.
  if (state_ != UnshardState::kGathering) FreeUnsharded();
}

void Nf4Base::FreeUnsharded() {
  if (unsharded_.storage().nbytes() == 0) return;
  ledger_->Sub(MemKind::kParams, unsharded_.nbytes());
  ReleaseStorage(unsharded_);
}

void Nf4Base::Unshard(comm::Communicator& shard_group) {
  if (state_ != UnshardState::kSharded) return;
  if (layout_.group_size > 1) {
    gathered_ = device_.Empty(layout_.gathered_bytes(), at::kByte);
    ledger_->Add(MemKind::kParams, gathered_.nbytes());
    gather_ = shard_group.AllGather(gathered_, piece_);
  }
  state_ = UnshardState::kGathering;
}

absl::Status Nf4Base::WaitForUnshard(CommWaiter& waiter) {
  if (state_ == UnshardState::kUnsharded) return absl::OkStatus();
  if (state_ == UnshardState::kSharded) {
    return absl::FailedPreconditionError(absl::StrCat(unit_, ": wait for an unshard that was never started"));
  }
  absl::Status s = gather_ ? waiter.OnDevice(*gather_, comm::Op::kAllGather) : absl::OkStatus();
  gather_.reset();
  if (s.ok()) {
    ReacquireStorage(unsharded_, layout_.numel * unsharded_.element_size());
    ledger_->Add(MemKind::kParams, unsharded_.nbytes());
    Dequantize(layout_.group_size > 1 ? gathered_ : piece_);
  }
  if (gathered_.defined()) {
    // (Work queued on the compute stream still reads it: the caching
    // allocator reuses its memory only for work ordered after this.)
    ledger_->Sub(MemKind::kParams, gathered_.nbytes());
    gathered_ = at::Tensor();
  }
  // A failed gather leaves the unit sharded (the communicator is aborted; the
  // step fails).
  state_ = s.ok() ? UnshardState::kUnsharded : UnshardState::kSharded;
  return s;
}

void Nf4Base::Dequantize(const at::Tensor& image) {
  const int64_t P = layout_.piece_blocks, C = Nf4Layout::kCodeBytes;
  const at::Tensor rows = image.view({-1, layout_.piece_bytes()});
  const at::Tensor codes = rows.narrow(1, 0, P * C).reshape({-1});
  const at::Tensor qabsmax = rows.narrow(1, P * C, P).reshape({-1});
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const Nf4Placement& p = layout_.matrices[i];
    Nf4Tensor t;
    t.numel = p.numel;
    t.packed = codes.narrow(0, p.first_block * C, (p.numel + 1) / 2);
    t.qabsmax = qabsmax.narrow(0, p.first_block, p.blocks);
    t.absmax2 = absmax2_.narrow(0, p.first_scale, p.scales);
    t.offset = offsets_[i];
    DequantizeNf4Into(t, tables_, unsharded_.narrow(0, p.value_offset, p.numel));
  }
}

absl::Status Nf4Base::Reshard() {
  if (state_ == UnshardState::kSharded) return absl::OkStatus();
  if (state_ == UnshardState::kGathering) {
    return absl::FailedPreconditionError(
        absl::StrCat(unit_, ": reshard while its all-gather is in flight (its buffer is still being written)"));
  }
  FreeUnsharded();
  state_ = UnshardState::kSharded;
  return absl::OkStatus();
}

}  // namespace shardline
