#include "worker/engine/grad_reduction.h"

#include "common/base/status_macros.h"

namespace shardline {

void GradReduction::Start(FlatParam* unit) {
  Pending p;
  p.unit = unit;
  at::Tensor src = unit->grad_full();
  if (src.scalar_type() != unit->grad_shard().scalar_type()) {
    p.cast = src.to(unit->grad_shard().scalar_type());
    ledger_->Add(MemKind::kGrads, p.cast.nbytes());
    src = p.cast;
  }
  p.reduce_scatter = shard_->ReduceScatter(unit->grad_shard(), src);
  // On the device, the all-reduce follows the reduce-scatter on the same
  // stream, issued now: every rank issues RS1 AR1 RS2 AR2 ... whatever the
  // timing (communicator.h, ordered_on_device).
  if (replicate_->size() > 1 && replicate_->ordered_on_device()) {
    p.all_reduce = replicate_->AllReduce(unit->grad_shard());
  }
  pending_.push_back(std::move(p));
}

absl::Status GradReduction::Pump(bool wait_all) {
  for (Pending& p : pending_) {
    if (p.scattered) continue;
    if (!wait_all && !p.reduce_scatter->Done()) break;
    // The compute stream waits before the buffers are freed: their memory
    // then goes only to work ordered after the reduce-scatter.
    SL_RETURN_IF_ERROR(waiter_->OnDevice(*p.reduce_scatter));
    p.scattered = true;
    if (p.cast.defined()) {
      ledger_->Sub(MemKind::kGrads, p.cast.nbytes());
      p.cast = at::Tensor();
    }
    if (!p.unit->options().persistent_grads) p.unit->FreeGrad();
    // On the host (Gloo), the all-reduce may start only once the shard holds
    // the reduce-scatter's result; the replicate communicator has its own
    // connections, so its ops need only keep their order among themselves.
    if (replicate_->size() > 1 && !p.all_reduce) p.all_reduce = replicate_->AllReduce(p.unit->grad_shard());
  }
  if (!wait_all) return absl::OkStatus();
  for (Pending& p : pending_) {
    if (p.all_reduce) SL_RETURN_IF_ERROR(waiter_->OnDevice(*p.all_reduce));
  }
  pending_.clear();
  return absl::OkStatus();
}

}  // namespace shardline
