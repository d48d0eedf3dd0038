#include "worker/engine/unit.h"

#include "common/base/status_macros.h"

namespace shardline {

Unit::Unit(std::unique_ptr<FlatParam> base, std::unique_ptr<FlatParam> adapters,
           std::vector<model::LoraTarget> targets, double lora_scaling, std::unique_ptr<Nf4Base> quantized)
    : base_(std::move(base)), adapters_(std::move(adapters)), quantized_(std::move(quantized)),
      targets_(std::move(targets)), lora_scaling_(lora_scaling) {
  if (!quantized_) return;
  const Weights& dense = base_->weights();
  const std::vector<Nf4Base::Matrix>& matrices = quantized_->matrices();
  merged_.resize(dense.size() + matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) merged_[matrices[i].unit_index] = quantized_->weights()[i];
  size_t next = 0;
  for (at::Tensor& w : merged_) {
    if (!w.defined()) w = dense[next++];
  }
}

FlatParam* Unit::trainable() const {
  if (adapters_) return adapters_.get();
  return base_->trainable() ? base_.get() : nullptr;
}

void Unit::Unshard(comm::Communicator& shard_group) {
  base_->Unshard(shard_group);
  if (quantized_) quantized_->Unshard(shard_group);
  if (adapters_) adapters_->Unshard(shard_group);
}

absl::Status Unit::Wait(CommWaiter& waiter) {
  SL_RETURN_IF_ERROR(base_->WaitForUnshard(waiter));
  if (quantized_) SL_RETURN_IF_ERROR(quantized_->WaitForUnshard(waiter));
  return adapters_ ? adapters_->WaitForUnshard(waiter) : absl::OkStatus();
}

absl::Status Unit::Reshard() {
  SL_RETURN_IF_ERROR(base_->Reshard());
  if (quantized_) SL_RETURN_IF_ERROR(quantized_->Reshard());
  return adapters_ ? adapters_->Reshard() : absl::OkStatus();
}

absl::Status Unit::ReshardTrainable() {
  FlatParam* t = trainable();
  return t ? t->Reshard() : absl::OkStatus();
}

bool Unit::gathering() const {
  return base_->state() == UnshardState::kGathering ||
         (quantized_ && quantized_->state() == UnshardState::kGathering) ||
         (adapters_ && adapters_->state() == UnshardState::kGathering);
}

BlockWeights Unit::block_weights() const {
  BlockWeights w(weights());
  if (!adapters_) return w;
  const Weights& a = adapters_->weights();
  w.lora.resize(w.base.size());
  w.lora_scaling = lora_scaling_;
  for (size_t t = 0; t < targets_.size(); ++t) w.lora[targets_[t].base_index] = {a[2 * t], a[2 * t + 1]};
  return w;
}

void Unit::EnsureGrads() {
  base_->EnsureGrad();
  if (adapters_) adapters_->EnsureGrad();
}

}  // namespace shardline
