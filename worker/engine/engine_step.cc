// The step's end: the step's sums, the update and the next step's first
// gather, the step itself, evaluation, memory, and what a checkpoint's load
// and export call. The unit schedule is engine.cc.
#include "worker/engine/engine.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "common/base/cpu_time.h"
#include "common/base/fault_injection.h"
#include "common/base/status_macros.h"
#include "common/model/model_shapes.h"

namespace shardline {

namespace {

// A gradient shard's squared L2 norm, as a double on its device. On the host,
// summed in double over the elements. On CUDA an fp32 shard is read once by
// one fused norm kernel (fp32 accumulation, as torch's clip_grad_norm_ does):
// the double copy, square and sum were three passes and 6 ms of a 350M
// GPT-2's 82 ms step on an H200 (bench/results/gpu_compare_h200.md). A tree
// reduction of n fp32 squares is within ~log2(n) ulp of the exact sum (3e-6
// relative at n = 2^24), far inside what the clip coefficient or the reported
// norm can show.
at::Tensor SquaredNorm(const at::Tensor& grad) {
  if (grad.is_cuda() && grad.scalar_type() == at::kFloat) return at::linalg_vector_norm(grad, 2).to(at::kDouble).square();
  return grad.to(at::kDouble).square().sum();
}

}  // namespace

absl::StatusOr<at::Tensor> Engine::StepSums(const at::Tensor& loss, bool vote_save) {
  // [squares of replicated shards, loss, save votes, squares of pieces]
  at::Tensor sums = device_->Zeros(4, at::kDouble);
  // The units reduced already first, while the last reductions run (the
  // backward's last unit's, the sparse rows'); then the rest. Summed in
  // unit order whatever the order they were computed in.
  SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/false));  // (those ended)
  std::vector<at::Tensor> squares(trainable_.size());
  for (size_t i = 0; i < trainable_.size(); ++i) {
    if (reduction_->Reduced(trainable_[i])) squares[i] = SquaredNorm(trainable_[i]->optimizer_grad());
  }
  SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/true));
  bool pieces = false;
  for (size_t i = 0; i < trainable_.size(); ++i) {
    const FlatParam* f = trainable_[i];
    pieces = pieces || f->replica_sharded();
    sums[f->replica_sharded() ? 3 : 0].add_(squares[i].defined() ? squares[i] : SquaredNorm(f->optimizer_grad()));
  }
  sums[1].copy_(loss);
  sums[2].fill_(vote_save ? 1.0 : 0.0);
  // Every shard group holds the whole (reduced) gradient once, so the sum of
  // squares over the shard group is the global one; the loss shares and
  // votes, and the pieces of an optimizer sharded across the replicas (each
  // held by one replica), are summed over the replicas too.
  if (comms_.shard->size() > 1) {
    const at::Tensor within = sums.narrow(0, 0, pieces ? 4 : 3);
    SL_RETURN_IF_ERROR(waiter_.OnDevice(*comms_.shard->AllReduce(within), comm::Op::kAllReduce));
  }
  if (comms_.replicate->size() > 1) {
    const at::Tensor across = sums.narrow(0, 1, pieces ? 3 : 2);
    SL_RETURN_IF_ERROR(waiter_.OnDevice(*comms_.replicate->AllReduce(across), comm::Op::kAllReduce));
  }
  sums[0].add_(sums[3]);
  return sums.narrow(0, 0, 3);
}

absl::Status Engine::SumOverWorld(at::Tensor t) {
  if (comms_.shard->size() > 1) {
    SL_RETURN_IF_ERROR(waiter_.OnDevice(*comms_.shard->AllReduce(t), comm::Op::kAllReduce));
  }
  if (comms_.replicate->size() > 1) {
    SL_RETURN_IF_ERROR(waiter_.OnDevice(*comms_.replicate->AllReduce(t), comm::Op::kAllReduce));
  }
  return absl::OkStatus();
}

absl::Status Engine::AllGatherPersistentParams() {
  // ZeRO 1/2: every rank needs the whole updated parameters again.
  if (comms_.shard->size() == 1) return absl::OkStatus();
  std::vector<std::shared_ptr<comm::Work>> gathers;
  for (FlatParam* f : trainable_) {
    if (f->options().persistent_params) gathers.push_back(comms_.shard->AllGather(f->unsharded(), f->OwnChunk(f->unsharded())));
  }
  for (const auto& w : gathers) SL_RETURN_IF_ERROR(waiter_.OnDevice(*w, comm::Op::kAllGather));
  return absl::OkStatus();
}

absl::Status Engine::OptimizerStep(int64_t step, double lr, const at::Tensor& clip_coef, bool prefetch_first_block) {
  const OptimizerConfig& o = config_.optimizer;
  AdamWStep s;
  s.lr = lr;
  s.beta1 = o.betas[0];
  s.beta2 = o.betas[1];
  s.eps = o.eps;
  s.weight_decay = o.weight_decay;
  s.step = step + 1;
  const Timeline::Scope span(timeline_, "optimizer");
  const absl::Time t0 = absl::Now();
  // The next step's first gather goes out while the rest update: at the
  // step's start nothing else could hide it (the sparse lookup's exchanges
  // queue behind it, and wait less than the gather did).
  // Sharded across the replicas, each unit's updated pieces are gathered
  // across them at once, in this order on every rank, and each unit's next
  // gather is queued after its pieces' (FlatParam::Unshard).
  auto update = [&](FlatParam* f) -> absl::Status {
    SL_RETURN_IF_ERROR(f->WaitForReplicaGather(waiter_));  // (a unit not gathered since the last update)
    f->OptimizerStep(s, clip_coef);
    f->GatherOverReplicas(*comms_.replicate);
    return absl::OkStatus();
  };
  FlatParam* early = prefetch_first_block ? units_[1].trainable() : nullptr;
  if (early) SL_RETURN_IF_ERROR(update(early));
  if (prefetch_first_block) Unshard(1);
  for (FlatParam* f : trainable_) {
    if (f != early) SL_RETURN_IF_ERROR(update(f));
  }
  if (units_[model::HeadUnit(config_.model)].base().trainable()) ForgetHeadPrefix();  // (a frozen base keeps it)
  optimizer_seconds_ = absl::ToDoubleSeconds(absl::Now() - t0);
  return AllGatherPersistentParams();
}

absl::Status Engine::DropGathers() {
  for (Unit& unit : units_) {
    if (unit.gathering()) SL_RETURN_IF_ERROR(unit.Wait(waiter_));
    SL_RETURN_IF_ERROR(unit.Reshard());
  }
  return absl::OkStatus();
}

absl::Status Engine::SyncHost() {
  SL_RETURN_IF_ERROR(device_->Synchronize(waiter_.timeout()));
  SL_RETURN_IF_ERROR(comms_.shard->status());
  return comms_.replicate->status();
}

absl::StatusOr<at::Tensor> Engine::ForwardBackwardAll(int64_t step) {
  ledger_.ResetPeak();
  device_->ResetPeakMemory();
  activation_peak_ = 0;
  const TrainConfig& t = config_.train;
  const int per_rank = t.batch_size / world_;
  const int micro = per_rank / t.micro_batch_size;
  // The mean over the targets of the global batch that count (all, without
  // loss masks): every rank computes the same count from the data alone.
  loss_scale_ = 1.0 / static_cast<double>(std::max<int64_t>(1, data_->CountedTargets(step, t.batch_size)));
  for (FlatParam* f : trainable_) f->ZeroGrad();
  at::Tensor loss = device_->Zeros(1, at::kDouble).squeeze();
  for (int mb = 0; mb < micro; ++mb) {
    at::Tensor x, y, positions;
    data_->Batch(step, t.batch_size, rank_ * per_rank + mb * t.micro_batch_size, t.micro_batch_size, &x, &y,
                 &positions);
    SL_RETURN_IF_ERROR(ForwardBackward(device_->FromHost(x), device_->FromHost(y), PackingOf(positions), mb,
                                       mb == micro - 1, &loss));
  }
  return loss;
}

absl::StatusOr<double> Engine::ComputeGradients(int64_t step) {
  const Device::ComputeScope on_device(*device_);
  waiter_.ResetExposed();
  SL_ASSIGN_OR_RETURN(at::Tensor loss, ForwardBackwardAll(step));
  SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/true));
  SL_RETURN_IF_ERROR(SyncHost());
  return loss.item<double>();
}

absl::StatusOr<StepResult> Engine::Step(int64_t step, StepOptions options) {
  const Device::ComputeScope on_device(*device_);
  const Timeline::Scope span(timeline_, "step", timeline_ ? absl::StrCat(step + 1) : std::string());
  const absl::Time t0 = absl::Now();
  const double cpu0 = ProcessCpuSeconds(), thread_cpu0 = ThreadCpuSeconds();
  waiter_.ResetExposed();
  const TrainConfig& t = config_.train;
  next_step_follows_ = options.next_step_follows;
  absl::StatusOr<at::Tensor> loss_or = ForwardBackwardAll(step);
  next_step_follows_ = false;
  SL_ASSIGN_OR_RETURN(at::Tensor loss, std::move(loss_or));
  // No collective follows the update (the next step's first gather may).
  SL_ASSIGN_OR_RETURN(const at::Tensor sums, StepSums(loss, options.vote_save));
  const at::Tensor norm = sums[0].sqrt();
  StepResult r;
  r.step = step;
  r.lr = LearningRate(config_.optimizer, step, t.steps);
  r.epoch = EpochAt(step + 1, t.batch_size, t.sequences_per_epoch);
  if (FaultRequested("nan-grad", step + 1)) norm.fill_(std::numeric_limits<double>::quiet_NaN());
  // The norm is the same on every rank, so every rank skips the same steps.
  // Reading it costs a device sync, paid only where skipping is allowed.
  r.skipped = t.max_nonfinite_skips > 0 && !std::isfinite(norm.item<double>());
  const bool prefetch = options.next_step_follows && model::IsBlock(config_.model, 1);
  if (!r.skipped) {
    SL_RETURN_IF_ERROR(OptimizerStep(step, r.lr, ClipCoefficient(norm, config_.optimizer.grad_clip), prefetch));
  } else if (prefetch) {
    Unshard(1);  // (the parameters did not change)
  }
  const at::Tensor results = at::cat({sums.narrow(0, 1, 2), norm.reshape({1})});
  SL_RETURN_IF_ERROR(SyncHost());
  const at::Tensor host = results.to(at::kCPU);
  r.loss = host[0].item<double>();
  r.save = host[1].item<double>() > 0;
  r.grad_norm = host[2].item<double>();
  r.tokens = static_cast<int64_t>(t.batch_size) * config_.model.block_size;
  r.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  r.exposed_comm_seconds = waiter_.exposed_seconds();
  r.exposed_all_gather_seconds = waiter_.exposed_seconds(comm::Op::kAllGather);
  r.exposed_reduce_scatter_seconds = waiter_.exposed_seconds(comm::Op::kReduceScatter);
  r.optimizer_seconds = r.skipped ? 0 : optimizer_seconds_;
  r.cpu_seconds = ProcessCpuSeconds() - cpu0;
  r.step_thread_cpu_seconds = ThreadCpuSeconds() - thread_cpu0;
  const int interval = t.eval_interval;
  if (val_ && interval > 0 && ((step + 1) % interval == 0 || step + 1 == t.steps)) {
    const absl::Time e0 = absl::Now();
    SL_ASSIGN_OR_RETURN(r.val_loss, Evaluate());
    r.eval_seconds = absl::ToDoubleSeconds(absl::Now() - e0);
  }
  const DeviceMemory mem = device_->Memory();
  tensor_peak_ = mem.peak_allocated;
  reserved_peak_ = mem.peak_reserved;
  return r;
}

absl::StatusOr<double> Engine::Evaluate() {
  if (!val_) return absl::FailedPreconditionError("no [data] val_path to evaluate on");
  const Device::ComputeScope on_device(*device_);
  c10::NoGradGuard no_grad;
  const TrainConfig& t = config_.train;
  const int per_rank = t.batch_size / world_;
  int64_t counted = 0;
  for (int b = 0; b < t.eval_batches; ++b) counted += val_->CountedTargets(b, t.batch_size);
  const double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, counted));
  at::Tensor loss = device_->Zeros(1, at::kDouble);
  for (int b = 0; b < t.eval_batches; ++b) {
    for (int mb = 0; mb < per_rank / t.micro_batch_size; ++mb) {
      at::Tensor x, y, positions;
      val_->Batch(b, t.batch_size, rank_ * per_rank + mb * t.micro_batch_size, t.micro_batch_size, &x, &y,
                  &positions);
      const ForwardPass pass{ForwardPass::kEvaluate, device_->FromHost(y), scale, PackingOf(positions)};
      SL_ASSIGN_OR_RETURN(const at::Tensor out, ForwardUnits(pass, device_->FromHost(x)));
      loss.add_(out.to(at::kDouble));
    }
  }
  SL_RETURN_IF_ERROR(SumOverWorld(loss));
  SL_RETURN_IF_ERROR(SyncHost());
  return loss.item<double>();
}

MemoryReport Engine::Memory() const {
  MemoryReport r;
  for (int k = 0; k < kNumMemKinds; ++k) {
    r.bytes[k] = ledger_.current(static_cast<MemKind>(k));
    r.peak_by_kind[k] = ledger_.peak(static_cast<MemKind>(k));
  }
  r.state_bytes = r.Of(MemKind::kParams) + r.Of(MemKind::kGrads) + r.Of(MemKind::kMaster) +
                  r.Of(MemKind::kOptimizer);
  r.peak_bytes = ledger_.peak();
  r.activation_peak_bytes = activation_peak_;
  r.init_peak_bytes = init_peak_;
  r.tensor_peak_bytes = tensor_peak_;
  r.reserved_peak_bytes = reserved_peak_;
  return r;
}

absl::Status Engine::PublishLoadedState() {
  const Device::ComputeScope on_device(*device_);
  SL_RETURN_IF_ERROR(DropGathers());
  for (FlatParam* f : trainable_) {
    f->PublishMaster();
    f->GatherOverReplicas(*comms_.replicate);
  }
  for (FlatParam* f : trainable_) SL_RETURN_IF_ERROR(f->WaitForReplicaGather(waiter_));
  ForgetHeadPrefix();
  SL_RETURN_IF_ERROR(AllGatherPersistentParams());
  return SyncHost();
}

absl::StatusOr<at::Tensor> Engine::Logits(const at::Tensor& inputs, const at::Tensor& positions) {
  const Device::ComputeScope on_device(*device_);
  c10::NoGradGuard no_grad;
  const ForwardPass pass{ForwardPass::kLogits, at::Tensor(), 0, PackingOf(positions)};
  SL_ASSIGN_OR_RETURN(const at::Tensor logits, ForwardUnits(pass, device_->FromHost(inputs)));
  SL_RETURN_IF_ERROR(SyncHost());
  return logits.to(at::kCPU);
}

absl::StatusOr<at::Tensor> Engine::GatherUnitMaster(int i) {
  const Device::ComputeScope on_device(*device_);
  FlatParam& f = *trainable_[i];
  SL_ASSIGN_OR_RETURN(const at::Tensor master, WholeShardOf(f, f.master()));
  at::Tensor out = device_->Zeros(f.layout().padded_numel, master.scalar_type());
  SL_RETURN_IF_ERROR(waiter_.OnHost(*comms_.shard->AllGather(out, master), comm::Op::kAllGather));
  return out.to(at::kCPU).to(at::kFloat);
}

absl::StatusOr<at::Tensor> Engine::WholeShardOf(const FlatParam& f, const at::Tensor& piece) {
  if (!f.replica_sharded()) return piece;
  at::Tensor all = device_->Empty(f.owned_numel() * comms_.replicate->size(), piece.scalar_type());
  SL_RETURN_IF_ERROR(waiter_.OnHost(*comms_.replicate->AllGather(all, piece), comm::Op::kAllGather));
  return all.narrow(0, 0, f.layout().shard_numel);
}

int64_t Engine::ShardStateOffset(int i) const {
  const FlatParam& f = *trainable_[i];
  return f.layout().ShardOffset(f.shard_rank()) + f.owned_offset();
}

int64_t Engine::ShardStateNumel(int i) const {
  const FlatParam& f = *trainable_[i];
  return std::max<int64_t>(0, std::min(f.owned_numel(), f.layout().shard_numel - f.owned_offset()));
}

absl::StatusOr<Engine::ShardState> Engine::WholeShard(int i) {
  const FlatParam& f = *trainable_[i];
  const ShardState live = Shard(i);
  if (!f.replica_sharded()) return live;
  const Device::ComputeScope on_device(*device_);
  ShardState whole;
  SL_ASSIGN_OR_RETURN(whole.master, WholeShardOf(f, live.master));
  SL_ASSIGN_OR_RETURN(whole.exp_avg, WholeShardOf(f, live.exp_avg));
  SL_ASSIGN_OR_RETURN(whole.exp_avg_sq, WholeShardOf(f, live.exp_avg_sq));
  return whole;
}

}  // namespace shardline
