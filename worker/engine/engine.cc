#include "worker/engine/engine.h"

#include <cmath>

#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "worker/engine/tensor_memory.h"
#include "common/status_macros.h"

namespace shardline {

struct Engine::UnitActivation {
  at::Tensor input;   // what the unit was given (kept for recomputation)
  at::Tensor leaf;    // the grad-requiring copy of input the graph starts at
  at::Tensor output;  // the unit's output with its graph (unless recomputed)
};

struct Engine::PendingReduce {
  int unit = 0;
  std::shared_ptr<comm::Work> reduce_scatter;
  at::Tensor cast;  // reduce-dtype copy of the gradient, alive until the op ends
  bool scattered = false;
  std::shared_ptr<comm::Work> all_reduce;  // across replicate groups
};

GroupPlan PlanGroups(const JobConfig& config, int rank, int world) {
  GroupPlan p;
  p.shard_size = ShardGroupSize(config, world);
  p.replicate_size = world / p.shard_size;
  p.shard_index = rank / p.shard_size;
  p.shard_rank = rank % p.shard_size;
  p.shard_name = absl::StrCat("shard.", p.shard_index, "/");
  p.replicate_name = absl::StrCat("replicate.", p.shard_rank, "/");
  return p;
}

absl::StatusOr<Communicators> ConnectGlooGroups(const c10::intrusive_ptr<c10d::Store>& store, const GroupPlan& plan,
                                                absl::Duration timeout) {
  auto connect = [&](const std::string& name, int rank, int size)
      -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    if (size == 1) return comm::CreateSelfCommunicator();
    comm::GlooOptions o;
    o.op_timeout = timeout;
    o.connect_timeout = timeout;
    return comm::CreateGlooCommunicator(store, name, rank, size, o);
  };
  Communicators c;
  SL_ASSIGN_OR_RETURN(c.shard, connect(plan.shard_name, plan.shard_rank, plan.shard_size));
  SL_ASSIGN_OR_RETURN(c.replicate, connect(plan.replicate_name, plan.shard_index, plan.replicate_size));
  return c;
}

// Fills a unit's flat buffer from a model file by nanoGPT's names (the tied
// wte may be stored as either name).
absl::Status ReadUnitFromModelFile(const SafetensorsReader& f, const ShardLayout& layout, at::Tensor flat) {
  flat.zero_();
  for (const ParamSlot& p : layout.params) {
    std::string name = p.spec.name;
    if (!f.entries().count(name) && name == "transformer.wte.weight") name = "lm_head.weight";
    auto it = f.entries().find(name);
    if (it == f.entries().end()) {
      return absl::NotFoundError(absl::StrCat(f.path(), ": [model] init_from has no tensor ", p.spec.name));
    }
    if (it->second.shape != p.spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor ", name, " has shape [",
                                                     absl::StrJoin(it->second.shape, ","), "], the model needs [",
                                                     absl::StrJoin(p.spec.shape, ","), "]"));
    }
    SL_RETURN_IF_ERROR(f.ReadFloats(name, 0, p.spec.numel(), flat.data_ptr<float>() + p.offset));
  }
  return absl::OkStatus();
}

namespace {
at::ScalarType TorchDType(DType d) { return d == DType::kFloat32 ? at::kFloat : at::kBFloat16; }
}  // namespace

Engine::Engine(const JobConfig& config, int rank, int world, Communicators comms, absl::Duration timeout)
    : config_(config), rank_(rank), world_(world), comms_(std::move(comms)), timeout_(timeout) {}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const JobConfig& config, int rank, int world,
                                                       Communicators comms, absl::Duration timeout) {
  const GroupPlan plan = PlanGroups(config, rank, world);
  if (!comms.shard || !comms.replicate || comms.shard->size() != plan.shard_size ||
      comms.replicate->size() != plan.replicate_size || comms.shard->rank() != plan.shard_rank) {
    return absl::InvalidArgumentError(absl::StrCat("[rank ", rank, "] communicators do not match the group plan (",
                                                   plan.shard_size, " x ", plan.replicate_size, ")"));
  }
  TensorMemory::Install();
  std::unique_ptr<Engine> e(new Engine(config, rank, world, std::move(comms), timeout));
  SL_RETURN_IF_ERROR(e->Init());
  return e;
}

absl::Status Engine::Init() {
  const ModelConfig& m = config_.model;
  SL_ASSIGN_OR_RETURN(data_, TokenDataset::Open(config_.data, m.vocab_size, m.block_size, config_.train.seed));
  const Strategy s = config_.parallelism.strategy;
  FlatParamOptions opts;
  opts.param_dtype = TorchDType(config_.precision.param_dtype);
  opts.reduce_dtype = TorchDType(config_.precision.reduce_dtype);
  opts.persistent_params = !ShardsParams(s);
  opts.persistent_grads = !ShardsGrads(s);
  const int G = comms_.shard->size();
  const int shard_rank = comms_.shard->rank();
  std::unique_ptr<SafetensorsReader> init_from;
  if (!m.init_from.empty()) {
    SL_ASSIGN_OR_RETURN(init_from, SafetensorsReader::Open(m.init_from));
  }
  for (int u = 0; u < gpt::NumUnits(m); ++u) {
    SL_ASSIGN_OR_RETURN(ShardLayout layout, MakeShardLayout(gpt::UnitName(m, u), gpt::UnitParams(m, u), G));
    // One unit at a time: the full fp32 values exist only while this unit's
    // shard is cut from them.
    at::Tensor init = at::empty({layout.padded_numel}, at::kFloat);
    if (init_from) {
      SL_RETURN_IF_ERROR(ReadUnitFromModelFile(*init_from, layout, init));
    } else {
      gpt::InitUnit(m, layout, config_.train.seed, init);
    }
    decay_.push_back(DecayRanges(layout, shard_rank));
    layouts_.push_back(layout);
    units_.push_back(std::make_unique<FlatParam>(std::move(layout), shard_rank, opts, &ledger_, init));
  }
  gathers_.resize(units_.size());
  init_peak_ = ledger_.peak();
  return absl::OkStatus();
}

gpt::Weights Engine::WeightsOf(int u) const { return units_[u]->weights(); }

absl::Status Engine::WaitWork(const std::shared_ptr<comm::Work>& w) {
  const absl::Time t0 = absl::Now();
  absl::Status s = w->Wait(timeout_);
  exposed_comm_ += absl::ToDoubleSeconds(absl::Now() - t0);
  return s;
}

// ---- unshard life cycle -------------------------------------------------

int Engine::inflight_gathers() const {
  int n = 0;
  for (const auto& u : units_) n += u->state == UnshardState::kGathering;
  return n;
}

void Engine::IssueGather(int u) {
  FlatParam& f = *units_[u];
  if (f.state != UnshardState::kSharded) return;
  f.AllocUnsharded();
  gathers_[u] = comms_.shard->AllGather(f.unsharded(), f.param_shard);
  f.state = UnshardState::kGathering;
}

absl::Status Engine::WaitGather(int u) {
  FlatParam& f = *units_[u];
  if (f.state == UnshardState::kUnsharded) return absl::OkStatus();
  IssueGather(u);
  absl::Status s = WaitWork(gathers_[u]);
  gathers_[u].reset();
  if (!s.ok()) return s;
  f.state = UnshardState::kUnsharded;
  return absl::OkStatus();
}

void Engine::Prefetch(int u) {
  const int limit = config_.prefetch.max_inflight_all_gathers;
  if (u < 0 || u >= static_cast<int>(units_.size())) return;
  if (units_[u]->state == UnshardState::kSharded && inflight_gathers() < limit) IssueGather(u);
}

void Engine::Reshard(int u) {
  FlatParam& f = *units_[u];
  if (f.options().persistent_params) return;
  f.FreeUnsharded();
}

// ---- forward and backward of one unit -----------------------------------

void Engine::TrackActivation(const at::Tensor& t, bool add) {
  if (!t.defined()) return;
  ledger_.Add(MemKind::kActivations, add ? t.nbytes() : -static_cast<int64_t>(t.nbytes()));
  activation_peak_ = std::max(activation_peak_, ledger_.current(MemKind::kActivations));
}

absl::Status Engine::Forward(int u, const at::Tensor& input, const at::Tensor& targets) {
  const ModelConfig& m = config_.model;
  UnitActivation& a = acts_[u];
  a.input = input;
  const gpt::Weights w = WeightsOf(u);
  if (u == 0) {
    a.output = gpt::EmbedForward(input, w);
  } else if (u == gpt::HeadUnit(m)) {
    a.leaf = input.detach().requires_grad_(true);
    a.output = gpt::HeadLoss(a.leaf, w, units_[0]->weights()[0], targets, loss_scale_);
  } else if (config_.memory.activation_checkpointing) {
    c10::NoGradGuard no_grad;  // keep only the input; recompute in backward
    a.output = gpt::BlockForward(input, w, m.n_head);
  } else {
    a.leaf = input.detach().requires_grad_(true);
    a.output = gpt::BlockForward(a.leaf, w, m.n_head);
  }
  TrackActivation(a.output, true);
  return absl::OkStatus();
}

absl::Status Engine::Backward(int u, at::Tensor* grad) {
  const ModelConfig& m = config_.model;
  UnitActivation& a = acts_[u];
  units_[u]->EnsureGrad();
  if (u == gpt::HeadUnit(m)) units_[0]->EnsureGrad();  // lm_head is tied to wte
  at::Tensor out = a.output;
  if (gpt::IsBlock(m, u) && config_.memory.activation_checkpointing) {
    a.leaf = a.input.detach().requires_grad_(true);
    out = gpt::BlockForward(a.leaf, WeightsOf(u), m.n_head);
  }
  if (grad->defined()) {
    out.backward(*grad);
  } else {
    out.backward();
  }
  TrackActivation(a.output, false);
  *grad = a.leaf.defined() ? a.leaf.grad() : at::Tensor();
  a = UnitActivation{};
  return absl::OkStatus();
}

absl::Status Engine::ForwardBackward(const at::Tensor& x, const at::Tensor& y, bool final_micro,
                                     double* loss) {
  const ModelConfig& m = config_.model;
  const int U = static_cast<int>(units_.size());
  const int head = gpt::HeadUnit(m);
  acts_.assign(U, UnitActivation{});
  at::Tensor h = x;
  for (int u = 0; u < U; ++u) {
    SL_RETURN_IF_ERROR(WaitGather(u));
    if (config_.prefetch.forward) {
      for (int v = u + 1; v < U && inflight_gathers() < config_.prefetch.max_inflight_all_gathers; ++v) Prefetch(v);
    }
    SL_RETURN_IF_ERROR(Forward(u, h, y));
    if (u != head) h = acts_[u].output.detach();
    // The embed unit stays gathered for the tied lm_head; the head unit runs
    // backward next, so neither is freed after forward.
    if (gpt::IsBlock(m, u)) Reshard(u);
  }
  *loss = acts_[head].output.item<double>();
  at::Tensor grad;
  const BackwardPrefetch bp = config_.prefetch.backward;
  for (int u = U - 1; u >= 0; --u) {
    SL_RETURN_IF_ERROR(WaitGather(u));
    if (bp == BackwardPrefetch::kPre && u - 1 >= 1) Prefetch(u - 1);
    SL_RETURN_IF_ERROR(Backward(u, &grad));
    if (bp == BackwardPrefetch::kPost && u - 1 >= 1) Prefetch(u - 1);
    if (gpt::IsBlock(m, u)) Reshard(u);
    // The last micro-batch reduces each unit as soon as its gradient is
    // complete; earlier ones accumulate locally (no communication).
    // (The embed unit comes last, after the tied lm_head added to wte.)
    if (final_micro) {
      StartReduce(u);
      SL_RETURN_IF_ERROR(PumpReductions(/*wait_all=*/false));
    }
  }
  Reshard(0);
  Reshard(head);
  acts_.clear();
  return absl::OkStatus();
}

// ---- gradient reduction -------------------------------------------------

void Engine::StartReduce(int u) {
  FlatParam& f = *units_[u];
  PendingReduce p;
  p.unit = u;
  at::Tensor src = f.grad_full();
  if (src.scalar_type() != f.grad_shard.scalar_type()) {
    p.cast = src.to(f.grad_shard.scalar_type());
    ledger_.Add(MemKind::kGrads, p.cast.nbytes());
    src = p.cast;
  }
  p.reduce_scatter = comms_.shard->ReduceScatter(f.grad_shard, src);
  pending_.push_back(std::move(p));
}

absl::Status Engine::PumpReductions(bool wait_all) {
  // Reductions finish in issue order; the replicate all-reduces are issued in
  // that same order on every rank, so their sequence numbers agree.
  for (PendingReduce& p : pending_) {
    if (p.scattered) continue;
    if (!wait_all && !p.reduce_scatter->Done()) break;
    SL_RETURN_IF_ERROR(WaitWork(p.reduce_scatter));
    p.scattered = true;
    FlatParam& f = *units_[p.unit];
    if (p.cast.defined()) {
      ledger_.Sub(MemKind::kGrads, p.cast.nbytes());
      p.cast = at::Tensor();
    }
    if (!f.options().persistent_grads) f.FreeGrad();
    if (comms_.replicate->size() > 1) p.all_reduce = comms_.replicate->AllReduce(f.grad_shard);
  }
  if (!wait_all) return absl::OkStatus();
  for (PendingReduce& p : pending_) {
    if (p.all_reduce) SL_RETURN_IF_ERROR(WaitWork(p.all_reduce));
  }
  pending_.clear();
  return absl::OkStatus();
}

// ---- norm, optimizer, step ----------------------------------------------

absl::StatusOr<double> Engine::GlobalGradNorm() {
  // Every shard group holds the whole (reduced) gradient once, so the sum of
  // squares over the shard group is the global one.
  double local = 0;
  for (const auto& f : units_) local += f->grad_shard.to(at::kDouble).square().sum().item<double>();
  at::Tensor t = at::full({1}, local, at::kDouble);
  if (comms_.shard->size() > 1) SL_RETURN_IF_ERROR(WaitWork(comms_.shard->AllReduce(t)));
  return std::sqrt(t.item<double>());
}

absl::StatusOr<double> Engine::SumOverWorld(double local) {
  at::Tensor t = at::full({1}, local, at::kDouble);
  if (comms_.shard->size() > 1) SL_RETURN_IF_ERROR(WaitWork(comms_.shard->AllReduce(t)));
  if (comms_.replicate->size() > 1) SL_RETURN_IF_ERROR(WaitWork(comms_.replicate->AllReduce(t)));
  return t.item<double>();
}

absl::Status Engine::OptimizerStep(int64_t step, double lr, double clip_coef) {
  const OptimizerConfig& o = config_.optimizer;
  AdamWStep s;
  s.lr = lr;
  s.beta1 = o.betas[0];
  s.beta2 = o.betas[1];
  s.eps = o.eps;
  s.weight_decay = o.weight_decay;
  s.step = step + 1;
  s.grad_scale = clip_coef;
  std::vector<std::shared_ptr<comm::Work>> gathers;
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatParam& f = *units_[u];
    AdamWUpdate(s, decay_[u], f.master, f.exp_avg, f.exp_avg_sq, f.grad_shard);
    f.PublishMaster();
    // ZeRO 1/2: every rank needs the whole updated parameters again.
    if (f.options().persistent_params && comms_.shard->size() > 1) {
      gathers.push_back(comms_.shard->AllGather(f.unsharded(), f.OwnChunk(f.unsharded())));
    }
  }
  for (const auto& w : gathers) SL_RETURN_IF_ERROR(WaitWork(w));
  return absl::OkStatus();
}

absl::StatusOr<double> Engine::ComputeGradients(int64_t step) {
  exposed_comm_ = 0;
  ledger_.ResetPeak();
  TensorMemory::ResetPeak();
  activation_peak_ = 0;
  const TrainConfig& t = config_.train;
  const int per_rank = t.batch_size / world_;
  const int micro = per_rank / t.micro_batch_size;
  loss_scale_ = 1.0 / (static_cast<double>(t.batch_size) * config_.model.block_size);
  for (auto& f : units_) f->ZeroGrad();
  double local_loss = 0;
  for (int mb = 0; mb < micro; ++mb) {
    at::Tensor x, y;
    data_->Batch(step, t.batch_size, rank_ * per_rank + mb * t.micro_batch_size, t.micro_batch_size, &x, &y);
    double l = 0;
    SL_RETURN_IF_ERROR(ForwardBackward(x, y, mb == micro - 1, &l));
    local_loss += l;
  }
  SL_RETURN_IF_ERROR(PumpReductions(/*wait_all=*/true));
  return local_loss;
}

absl::StatusOr<StepResult> Engine::Step(int64_t step) {
  const absl::Time t0 = absl::Now();
  const TrainConfig& t = config_.train;
  SL_ASSIGN_OR_RETURN(const double local_loss, ComputeGradients(step));
  StepResult r;
  r.step = step;
  SL_ASSIGN_OR_RETURN(r.grad_norm, GlobalGradNorm());
  r.lr = LearningRate(config_.optimizer, step, t.steps);
  SL_RETURN_IF_ERROR(OptimizerStep(step, r.lr, ClipCoefficient(r.grad_norm, config_.optimizer.grad_clip)));
  SL_ASSIGN_OR_RETURN(r.loss, SumOverWorld(local_loss));
  r.tokens = static_cast<int64_t>(t.batch_size) * config_.model.block_size;
  r.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  r.exposed_comm_seconds = exposed_comm_;
  tensor_peak_ = TensorMemory::peak();
  return r;
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
  return r;
}

absl::Status Engine::PublishLoadedState() {
  std::vector<std::shared_ptr<comm::Work>> gathers;
  for (auto& f : units_) {
    f->PublishMaster();
    if (f->options().persistent_params && comms_.shard->size() > 1) {
      gathers.push_back(comms_.shard->AllGather(f->unsharded(), f->OwnChunk(f->unsharded())));
    }
  }
  for (const auto& w : gathers) SL_RETURN_IF_ERROR(WaitWork(w));
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Engine::GatherUnitMaster(int unit) {
  FlatParam& f = *units_[unit];
  at::Tensor out = at::zeros({f.layout().padded_numel}, at::kFloat);
  SL_RETURN_IF_ERROR(WaitWork(comms_.shard->AllGather(out, f.master)));
  return out;
}

}  // namespace shardline
