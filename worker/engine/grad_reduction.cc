#include "worker/engine/grad_reduction.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace shardline {

absl::Status GradReduction::Start(FlatParam* unit, bool accumulate, bool last) {
  Pending p;
  p.unit = unit;
  p.last = last;
  at::Tensor src = unit->grad_full();
  // A one-rank group's reduce-scatter is a copy, which casts as it copies
  // (communicator.h): no reduce-dtype copy of the gradient first, which was a
  // pass and a unit-sized buffer more (34 DtoD copies, 0.7 ms of a GPT-2
  // 350M step on an H200, bench/results/gpu_compare_h200.md).
  if (src.scalar_type() != unit->grad_shard().scalar_type() && shard_->size() > 1) {
    p.cast = src.to(unit->grad_shard().scalar_type());
    ledger_->Add(MemKind::kGrads, p.cast.nbytes());
    src = p.cast;
  }
  at::Tensor out = unit->grad_shard();
  if (accumulate) {
    p.scratch = at::empty_like(out);
    ledger_->Add(MemKind::kGrads, p.scratch.nbytes());
    out = p.scratch;
  }
  p.reduce_scatter = shard_->ReduceScatter(out, src);
  // On the device, everything after the reduce-scatter is issued now, in
  // the same order on every rank whatever the timing (communicator.h,
  // ordered_on_device): the add on the compute stream once the scatter is
  // done, then the all-reduce, which each op orders after the compute stream.
  if (shard_->ordered_on_device() && accumulate) {
    SL_RETURN_IF_ERROR(waiter_->OnDevice(*p.reduce_scatter, comm::Op::kReduceScatter));
    unit->AddToGradShard(p.scratch);
  }
  if (last && replicate_->size() > 1 && replicate_->ordered_on_device()) {
    p.all_reduce = AcrossReplicas(unit, nullptr);
  } else if (last && replicate_->size() > 1 && !accumulate && !AllReduceAwaited()) {
    // On the host (Gloo), where the reduce-scatter writes the shard itself,
    // the all-reduce is queued now to start the moment it finishes, on the
    // replicate communicator's thread: issued from Pump it would wait for
    // the step thread to finish the next unit's backward, with the replicas'
    // link idle. (Accumulating, the shard holds the sum only once Finish
    // added the scratch into it.) The all-reduces keep the order of their
    // Starts on every rank: one queued here follows every earlier one, or
    // waits for Finish (FIFO) behind one not yet queued.
    p.all_reduce = AcrossReplicas(unit, p.reduce_scatter);
  }
  pending_.push_back(std::move(p));
  return absl::OkStatus();
}

std::shared_ptr<comm::Work> GradReduction::AcrossReplicas(FlatParam* unit, std::shared_ptr<comm::Work> after) {
  if (unit->replica_sharded()) {
    return replicate_->ReduceScatterAfter(unit->grad_owned(), unit->ReplicaReduceInput(), std::move(after));
  }
  return replicate_->AllReduceAfter(unit->grad_shard(), std::move(after));
}

bool GradReduction::AllReduceAwaited() const {
  for (const Pending& p : pending_) {
    if (p.last && !p.all_reduce) return true;
  }
  return false;
}

absl::Status GradReduction::Finish(Pending& p) {
  // The compute stream waits before the buffers are freed: their memory
  // then goes only to work ordered after the reduce-scatter.
  SL_RETURN_IF_ERROR(waiter_->OnDevice(*p.reduce_scatter, comm::Op::kReduceScatter));
  p.scattered = true;
  if (p.scratch.defined()) {
    if (!shard_->ordered_on_device()) p.unit->AddToGradShard(p.scratch);  // (on the device: added in Start)
    ledger_->Sub(MemKind::kGrads, p.scratch.nbytes());
    p.scratch = at::Tensor();
  }
  if (p.cast.defined()) {
    ledger_->Sub(MemKind::kGrads, p.cast.nbytes());
    p.cast = at::Tensor();
  }
  if (!p.unit->options().persistent_grads) p.unit->FreeGrad();
  // On the host (Gloo), the all-reduce may start only once the shard holds
  // the reduce-scatter's result; the replicate communicator has its own
  // connections, so its ops need only keep their order among themselves.
  if (p.last && replicate_->size() > 1 && !p.all_reduce) p.all_reduce = AcrossReplicas(p.unit, nullptr);
  return absl::OkStatus();
}

absl::Status GradReduction::Pump(bool wait_all, size_t max_in_flight) {
  size_t in_flight = 0;
  for (const Pending& p : pending_) in_flight += p.scattered ? 0 : 1;
  for (Pending& p : pending_) {
    if (p.scattered) continue;
    if (!wait_all && in_flight <= max_in_flight && !p.reduce_scatter->Done()) break;
    --in_flight;
    SL_RETURN_IF_ERROR(Finish(p));
  }
  if (!wait_all) return absl::OkStatus();
  for (Pending& p : pending_) {
    if (p.all_reduce) SL_RETURN_IF_ERROR(waiter_->OnDevice(*p.all_reduce, comm::Op::kAllReduce));
  }
  pending_.clear();
  return absl::OkStatus();
}

bool GradReduction::Reduced(const FlatParam* unit) const {
  for (const Pending& p : pending_) {
    if (p.unit == unit && (!p.scattered || (p.all_reduce && !p.all_reduce->Done()))) return false;
  }
  return true;
}

absl::Status GradReduction::AddShard(FlatParam* unit, const at::Tensor& part, bool replace, bool last) {
  // A unit's all-reduce must follow every all-reduce started before it, on
  // every rank alike: the reductions started earlier finish first, in order.
  if (unit->replica_sharded()) {
    return absl::InternalError(absl::StrCat(unit->layout().unit, ": a shard added by hand has no reduce-scatter across ",
                                            "the replicas (its optimizer is not sharded across them)"));
  }
  const bool all_reduce = last && replicate_->size() > 1;
  for (Pending& p : pending_) {
    if (!p.scattered && (all_reduce || p.unit == unit)) SL_RETURN_IF_ERROR(Finish(p));
    if (p.unit == unit && p.all_reduce) SL_RETURN_IF_ERROR(waiter_->OnDevice(*p.all_reduce, comm::Op::kAllReduce));
  }
  if (replace) {
    unit->grad_shard().copy_(part);
  } else {
    unit->AddToGradShard(part);
  }
  if (all_reduce) {
    Pending p;
    p.unit = unit;
    p.scattered = true;
    p.all_reduce = replicate_->AllReduce(unit->grad_shard());
    pending_.push_back(std::move(p));
  }
  return absl::OkStatus();
}

}  // namespace shardline
