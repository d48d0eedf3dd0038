// The engine's construction and the unit schedule: prefetch, each unit's
// forward and backward, and when its gradient is reduced. The step's end is
// engine_step.cc; the token table's gather-free paths, engine_table.cc.
#include "worker/engine/engine.h"

#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "common/base/ring_bytes.h"
#include "common/base/status_macros.h"
#include "common/model/model_shapes.h"
#include "common/model/weight_source.h"
#include "worker/device/tensor_memory.h"

namespace shardline {

at::ScalarType TorchDType(DType d) { return d == DType::kFloat32 ? at::kFloat : at::kBFloat16; }
// FlatParamOptions' name for 8-bit moments is kByte.
at::ScalarType MomentsTorchDType(MomentsDType d) {
  return d == MomentsDType::kFloat32 ? at::kFloat : d == MomentsDType::kBFloat16 ? at::kBFloat16 : at::kByte;
}

Engine::Engine(const JobConfig& config, int rank, int world, std::shared_ptr<const Device> device,
               Communicators comms, absl::Duration timeout)
    : config_(config), rank_(rank), world_(world), device_(std::move(device)),
      family_(MakeModelFamily(config.model, config.memory.recompute_cheap_ops)),
      comms_(std::move(comms)),
      waiter_(timeout) {}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const JobConfig& config, int rank, int world,
                                                       std::shared_ptr<const Device> device, Communicators comms,
                                                       absl::Duration timeout) {
  const GroupPlan plan = PlanGroups(config, rank, world);
  if (!comms.shard || !comms.replicate || comms.shard->size() != plan.shard_size ||
      comms.replicate->size() != plan.replicate_size || comms.shard->rank() != plan.shard_rank) {
    return absl::InvalidArgumentError(absl::StrCat("[rank ", rank, "] communicators do not match the group plan (",
                                                   plan.shard_size, " x ", plan.replicate_size, ")"));
  }
  if (!device) return absl::InvalidArgumentError(absl::StrCat("[rank ", rank, "] no device"));
  TensorMemory::Install();
  std::unique_ptr<Engine> e(new Engine(config, rank, world, std::move(device), std::move(comms), timeout));
  SL_RETURN_IF_ERROR(e->Init());
  return e;
}

absl::Status Engine::Init() {
  const Device::ComputeScope on_device(*device_);
  if (config_.optimizer.moments_dtype == MomentsDType::kDynamic8Bit && device_->is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("[rank ", rank_, "] [optimizer] moments_dtype = \"8bit\" runs on ",
                                                   "CPU devices only; this rank's device is CUDA"));
  }
  // TF32 changes fp32 matrix products on CUDA; the numerics contract is
  // fp32's, so it is on only where the job asks.
  at::globalContext().setAllowTF32CuBLAS(config_.precision.allow_tf32);
  at::globalContext().setAllowTF32CuDNN(config_.precision.allow_tf32);
  const ModelConfig& m = config_.model;
  SL_ASSIGN_OR_RETURN(data_, TokenDataset::Open(config_.data.format, config_.data.train, m.vocab_size,
                                                 m.block_size, config_.train.seed));
  const bool synthetic = config_.data.format == DataFormat::kSynthetic;
  if (!config_.data.val.empty() || (synthetic && config_.train.eval_interval > 0)) {
    // Synthetic validation data is the generator under another seed.
    const uint64_t val_seed = synthetic ? config_.train.seed ^ 0x5eedda7aull : config_.train.seed;
    SL_ASSIGN_OR_RETURN(val_, TokenDataset::Open(config_.data.format, config_.data.val, m.vocab_size, m.block_size,
                                                 val_seed));
  }
  SL_ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> weights, WeightSource::Open(m));
  if (weights) SL_RETURN_IF_ERROR(weights->Check());
  SL_ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> adapters, WeightSource::OpenAdapters(m, config_.lora));
  if (adapters) SL_RETURN_IF_ERROR(adapters->Check());
  for (int u = 0; u < model::NumUnits(m); ++u) SL_RETURN_IF_ERROR(InitUnit(u, weights.get(), adapters.get()));
  for (const Unit& unit : units_) {
    if (FlatParam* f = unit.trainable()) {
      trainable_.push_back(f);
      trainable_layouts_.push_back(f->layout());
    }
  }
  reduction_ = std::make_unique<GradReduction>(comms_.shard.get(), comms_.replicate.get(), &waiter_, &ledger_);
  const FlatParam& embed = units_[0].base();
  if (config_.parallelism.sparse_embedding && !embed.options().persistent_params && comms_.shard->size() > 1) {
    sparse_embedding_ = std::make_unique<SparseEmbedding>(embed.layout(), comms_.shard->rank());
    tied_sparse_ = m.tied();
    const int64_t tokens = int64_t{config_.train.micro_batch_size} * m.block_size;
    world_rows_ = comms_.replicate->size() > 1 &&
                  sparse_embedding_->RowsBeatAllReduce(tokens, comms_.shard->size(), comms_.replicate->size());
    // The head's loss over the vocabulary table where it lies (tied: the
    // embed unit's wte; untied: the head unit's lm_head, after its norm),
    // where that moves fewer bytes than gathering the unit that holds it.
    const Unit& holder = units_[tied_sparse_ ? 0 : model::HeadUnit(m)];
    const ShardLayout& layout = holder.base().layout();
    const int table = tied_sparse_ ? 0 : static_cast<int>(layout.params.size()) - 1;
    const FlatParamOptions& o = holder.base().options();
    const int trained_bytes = holder.trainable() ? at::elementSize(o.reduce_dtype) : 0;
    if (comm::VocabParallelBeatsGather(comms_.shard->size() * tokens, m.n_embd, layout.padded_numel,
                                       at::elementSize(o.param_dtype), at::elementSize(o.reduce_dtype),
                                       trained_bytes)) {
      // Trained (tied, with the rows' gradients every replica's), over the
      // world where the replicas then exchange fewer bytes.
      const int replicas = comms_.replicate->size();
      const int64_t step_tokens = tokens * (config_.train.batch_size / world_ / config_.train.micro_batch_size);
      const bool world = replicas > 1 && (!tied_sparse_ || world_rows_) && trained_bytes > 0 &&
                         comm::HeadOverWorldBeatsAllReduce(step_tokens, m.n_embd, layout.shard_numel,
                                                           at::elementSize(o.param_dtype), trained_bytes, replicas);
      vocab_head_ = std::make_unique<VocabParallelHead>(layout, table, comms_.shard->rank(), world ? replicas : 1,
                                                        world ? comms_.replicate->rank() : 0);
      head_holds_table_ = !tied_sparse_;
      head_prefix_numel_ = layout.params[table].offset;
    }
  }
  reduce_every_micro_ = ShardsGrads(config_.parallelism.strategy) &&
                        config_.train.grad_accumulation == GradAccumulation::kSharded;
  init_peak_ = ledger_.peak();
  SL_RETURN_IF_ERROR(device_->Synchronize(waiter_.timeout()));
  device_->ReleaseCachedMemory();  // the weights' loading buffers are not a step's
  return absl::OkStatus();
}

absl::Status Engine::InitUnit(int u, const WeightSource* weights, const WeightSource* adapters) {
  const ModelConfig& m = config_.model;
  const LoraConfig& lora = config_.lora;
  const Strategy s = config_.parallelism.strategy;
  FlatParamOptions opts;
  opts.param_dtype = TorchDType(config_.precision.param_dtype);
  opts.reduce_dtype = TorchDType(config_.precision.reduce_dtype);
  opts.master_dtype = TorchDType(config_.optimizer.master_dtype);
  opts.moments_dtype = MomentsTorchDType(config_.optimizer.moments_dtype);
  opts.persistent_params = !ShardsParams(s);
  opts.persistent_grads = !ShardsGrads(s);
  const int G = comms_.shard->size();
  const int shard_rank = comms_.shard->rank();
  if (model::OptimizerInPieces(config_.parallelism, m, G, comms_.replicate->size(), u)) {
    opts.optimizer_shards = comms_.replicate->size();
    opts.optimizer_rank = comms_.replicate->rank();
  }
  // Each rank asks only for the range it keeps (its shard where parameters
  // stay sharded), a bounded piece at a time, on the host: the values are a
  // function of the seed or the file alone, whatever the device.
  auto make = [&](ShardLayout layout, const FlatParamOptions& o, int rank, const WeightSource* from,
                  const ParamInitOf& init_of) -> absl::StatusOr<std::unique_ptr<FlatParam>> {
    InitValues values;
    if (from) {
      values = [from, layout](int64_t begin, at::Tensor out) {
        return ReadUnitRange(*from, layout, begin, out.numel(), out.data_ptr<float>());
      };
    } else {
      auto seeded = std::make_shared<SeededUnitValues>(layout, config_.train.seed, init_of);
      values = [seeded](int64_t begin, at::Tensor out) {
        seeded->Fill(begin, out);
        return absl::OkStatus();
      };
    }
    return FlatParam::Create(std::move(layout), rank, o, *device_, &ledger_, values);
  };
  auto init_base = [this](const ParamSpec& p) { return family_->InitOf(p); };
  FlatParamOptions base = opts;
  int base_group = G, base_rank = shard_rank;
  if (lora.enabled) {
    // The frozen base: sharded and gathered per use, or whole on every rank
    // (as it is anyway in a shard group of one).
    base.trainable = false;
    base.optimizer_shards = 1, base.optimizer_rank = 0;
    base.persistent_params = lora.base == LoraBase::kReplicated || G == 1;
    if (base.persistent_params) base_group = 1, base_rank = 0;
  }
  std::vector<ParamSpec> dense = model::UnitParams(m, u);
  std::unique_ptr<Nf4Base> quantized;
  if (lora.enabled && lora.base_dtype == LoraBaseDType::kNf4 && model::IsBlock(m, u)) {
    SL_ASSIGN_OR_RETURN(quantized, QuantizeBlockBase(u, weights, base_group, base_rank, &dense));
  }
  SL_ASSIGN_OR_RETURN(ShardLayout layout, MakeShardLayout(model::UnitName(m, u), std::move(dense), base_group));
  SL_ASSIGN_OR_RETURN(std::unique_ptr<FlatParam> unit, make(std::move(layout), base, base_rank, weights, init_base));
  std::vector<model::LoraTarget> targets = model::LoraTargets(m, lora, u);
  std::unique_ptr<FlatParam> unit_adapters;
  if (lora.enabled && !targets.empty()) {
    SL_ASSIGN_OR_RETURN(ShardLayout l,
                        MakeShardLayout(model::UnitName(m, u) + ".lora", model::AdapterParams(m, lora, u), G));
    SL_ASSIGN_OR_RETURN(unit_adapters, make(std::move(l), opts, shard_rank, adapters, AdapterInitOf));
  }
  units_.emplace_back(std::move(unit), std::move(unit_adapters), std::move(targets), lora.scaling(),
                      std::move(quantized));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Nf4Base>> Engine::QuantizeBlockBase(int u, const WeightSource* weights, int group,
                                                                   int rank, std::vector<ParamSpec>* params) {
  // The matrices (bitsandbytes quantizes the linear layers' weights; the
  // norms and biases stay dense), each read and quantized whole, one at a
  // time: its offset is the mean over all its blocks.
  Nf4Split split = SplitNf4Matrices(std::move(*params));
  *params = std::move(split.dense);
  std::vector<Nf4Base::Matrix> matrices;
  for (size_t i = 0; i < split.matrices.size(); ++i) matrices.push_back({split.matrices[i], split.matrix_index[i]});
  SL_ASSIGN_OR_RETURN(ShardLayout whole,
                      MakeShardLayout(model::UnitName(config_.model, u), std::move(split.matrices), 1));
  std::optional<SeededUnitValues> seeded;
  if (!weights) seeded.emplace(whole, config_.train.seed, [this](const ParamSpec& p) { return family_->InitOf(p); });
  std::vector<Nf4Tensor> quantized;
  for (const ParamSlot& slot : whole.params) {
    at::Tensor values = at::empty({slot.spec.numel()}, at::kFloat);
    if (weights) {
      SL_RETURN_IF_ERROR(ReadUnitRange(*weights, whole, slot.offset, values.numel(), values.data_ptr<float>()));
    } else {
      seeded->Fill(slot.offset, values);
    }
    quantized.push_back(QuantizeNf4(values));
  }
  return std::make_unique<Nf4Base>(whole.unit, std::move(matrices), quantized, group, rank,
                                   TorchDType(config_.precision.param_dtype), *device_, &ledger_);
}

// ---- prefetch -------------------------------------------------------------

int Engine::inflight_gathers() const {
  int n = 0;
  for (const Unit& unit : units_) n += unit.gathering();
  return n;
}

void Engine::Prefetch(int u) {
  const int limit = config_.prefetch.max_inflight_all_gathers;
  if (u < 0 || u >= static_cast<int>(units_.size()) || inflight_gathers() >= limit) return;
  Unshard(u);
}

bool Engine::NeedsTable(int u) const {
  return tied_sparse_ && !head_vocab_parallel_ && u == model::HeadUnit(config_.model);
}

void Engine::Unshard(int u) {
  if (HeadExchanged(u)) return IssueHeadPrefix();
  if (NeedsTable(u)) units_[0].Unshard(*comms_.shard);
  units_[u].Unshard(*comms_.shard);
}

absl::Status Engine::WaitUnsharded(int u) {
  if (HeadExchanged(u)) return WaitHeadPrefix();
  if (NeedsTable(u)) SL_RETURN_IF_ERROR(units_[0].Wait(waiter_));
  return units_[u].Wait(waiter_);
}

// ---- the unit schedule ----------------------------------------------------

void Engine::TrackActivation(const at::Tensor& t, bool add) {
  if (!t.defined()) return;
  ledger_.Add(MemKind::kActivations, add ? t.nbytes() : -static_cast<int64_t>(t.nbytes()));
  activation_peak_ = std::max(activation_peak_, ledger_.current(MemKind::kActivations));
}

absl::StatusOr<at::Tensor> Engine::ForwardUnits(const ForwardPass& pass, at::Tensor h) {
  const ModelConfig& m = config_.model;
  const int U = static_cast<int>(units_.size());
  const int head = model::HeadUnit(m);
  // Training prefetches as far ahead as max_inflight_all_gathers allows;
  // forward-only passes one unit ahead.
  const int lookahead = pass.train() ? U : 1;
  const int max_inflight = config_.prefetch.max_inflight_all_gathers;
  head_vocab_parallel_ = vocab_head_ && pass.kind != ForwardPass::kLogits;
  // The head's loss is fused with its backward (LinearCrossEntropy,
  // VocabParallelHead), so training's backward prefetch starts at the head:
  // the blocks backward needs first are gathered while the head computes,
  // where the link would idle (trace-rank-N.json), not later behind the
  // head's reduce-scatters.
  const bool head_prefetch = pass.train() && config_.prefetch.backward == BackwardPrefetch::kPre;
  // (At most `most` of them: the vocabulary-parallel head sends the first
  // while its statistics compute, VocabParallelHead::Run.)
  auto prefetch_backward = [&](int most) {
    for (int v = head - 2, n = inflight_gathers(); v >= 1 && most > 0 && n < max_inflight; --v) {
      Prefetch(v);
      most -= inflight_gathers() - n;
      n = inflight_gathers();
    }
  };
  for (int u = 0; u < U; ++u) {
    Unit& unit = units_[u];
    const bool sparse = u == 0 && sparse_embedding_;  // (not gathered for the lookup)
    if (sparse) {
      // The lookup's exchanges go first: they are small, and every unit
      // after waits for them (queued behind prefetches, they would wait for
      // those).
      const Timeline::Scope span(timeline_, "forward", unit.name());
      SL_ASSIGN_OR_RETURN(h, EmbedSparse(h, pass));
    } else {
      Unshard(u);  // (unless prefetched)
      SL_RETURN_IF_ERROR(WaitUnsharded(u));
    }
    // The previous micro-batch's last reductions (sharded accumulation keeps
    // one in flight) finish as they complete, not at the next backward:
    // each holds a unit's whole gradient and its scratch shard (the tied
    // table's: 1 + 1/N of its unit's bytes more at forward's peak).
    if (pass.train()) SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/false));
    if (config_.prefetch.forward) {
      const int until = std::min(U, u + 1 + lookahead);
      for (int v = u + 1; v < until && inflight_gathers() < max_inflight; ++v) Prefetch(v);
    }
    // (The vocabulary-parallel head's exchanges go before the prefetch:
    // the head waits for them.)
    const bool vocab = u == head && head_vocab_parallel_;
    if (u == head && head_prefetch && !vocab) prefetch_backward(std::numeric_limits<int>::max());
    if (vocab) {
      const Timeline::Scope span(timeline_, "forward", unit.name());
      SL_ASSIGN_OR_RETURN(h, HeadVocabParallel(h, pass, head_prefetch ? prefetch_backward : std::function<void(int)>()));
    } else if (!sparse) {
      const Timeline::Scope span(timeline_, "forward", unit.name());
      h = UnitForward(u, h, pass);
    }
    // The embed unit stays gathered for the tied lm_head (where it is
    // gathered at all: the sparse one is for the head). Training runs the
    // head's backward next, so it keeps the head too, and the last block,
    // whose backward follows the head's (torchtitan leaves it unsharded
    // after forward: resharding it would gather it again at once).
    const bool keep = pass.train() && (u == head || u == head - 1);
    if ((model::IsBlock(m, u) || u == head) && !keep) SL_RETURN_IF_ERROR(unit.Reshard());
  }
  if (!pass.train()) SL_RETURN_IF_ERROR(units_[0].Reshard());
  return h;
}

at::Tensor Engine::UnitForward(int u, const at::Tensor& h, const ForwardPass& pass) {
  if (!pass.train()) return UnitOutput(u, h, pass);  // (the caller holds no-grad)
  // A checkpointed block keeps only its input and recomputes in backward.
  const bool recompute = model::IsBlock(config_.model, u) && config_.memory.activation_checkpointing;
  Unit::Activation a;
  a.input = h;
  if (recompute) {
    c10::NoGradGuard no_grad;
    a.output = UnitOutput(u, h, pass);
  } else {
    if (u != 0) a.leaf = h.detach().requires_grad_(true);  // (token ids need no gradient)
    a.output = UnitOutput(u, a.leaf.defined() ? a.leaf : h, pass);
  }
  TrackActivation(a.output, true);
  at::Tensor out = a.output.detach();
  units_[u].Keep(std::move(a));
  return out;
}

at::Tensor Engine::UnitOutput(int u, const at::Tensor& h, const ForwardPass& pass) const {
  const Weights& embed = units_[0].weights();
  if (u == 0) return family_->Embed(h, embed, pass.packing);
  if (u != model::HeadUnit(config_.model)) return family_->Block(h, units_[u].block_weights(), pass.packing);
  if (pass.kind == ForwardPass::kLogits) return family_->HeadLogits(h, units_[u].weights(), embed);
  return family_->HeadLoss(h, units_[u].weights(), embed, pass.targets, pass.loss_scale);
}

absl::Status Engine::Backward(int u, at::Tensor* grad) {
  const ModelConfig& m = config_.model;
  Unit& unit = units_[u];
  if (!HeadExchanged(u)) unit.EnsureGrads();  // (frozen FlatParams have none; an exchanged head needs none whole)
  // The lm_head is the token embedding (the vocabulary-parallel head
  // computed its gradient's shard already).
  if (u == model::HeadUnit(m) && m.tied() && !head_vocab_parallel_) units_[0].base().EnsureGrad();
  Unit::Activation a = unit.Take();
  at::Tensor out = a.output;
  if (model::IsBlock(m, u) && config_.memory.activation_checkpointing) {
    a.leaf = a.input.detach().requires_grad_(true);
    out = family_->Block(a.leaf, unit.block_weights(), packing_);
  }
  if (grad->defined()) {
    out.backward(*grad);
  } else {
    out.backward();
  }
  TrackActivation(a.output, false);
  *grad = a.leaf.defined() ? a.leaf.grad() : at::Tensor();
  return absl::OkStatus();
}

absl::Status Engine::BackwardUnits(int micro, bool final_micro) {
  const ModelConfig& m = config_.model;
  const int U = static_cast<int>(units_.size());
  at::Tensor grad;
  const BackwardPrefetch bp = config_.prefetch.backward;
  // Under LoRA the frozen embedding needs no backward at all.
  const int last = config_.lora.enabled ? 1 : 0;
  // The sparse lookup's backward follows the first block's: the rows'
  // exchange (small, waited for at once) goes out before that block's
  // reduce-scatter instead of queued behind it, and the reduce-scatter runs
  // while the rows' gradient and the step's sums compute. (Not where the
  // rows go across the replicas: every reduction started is issued before
  // that exchange, BackwardSparseEmbed.)
  std::function<absl::Status()> start_block;
  for (int u = U - 1; u >= last; --u) {
    if (u == 0 && sparse_embedding_) {
      const Timeline::Scope span(timeline_, "backward", units_[0].name());
      SL_RETURN_IF_ERROR(BackwardSparseEmbed(micro, final_micro, grad, start_block));
      if (start_block) SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/false, reduce_every_micro_ ? 1 : SIZE_MAX));
      break;
    }
    Unit& unit = units_[u];
    if (!HeadExchanged(u)) {  // (whose backward's graph holds what it needs)
      Unshard(u);             // (unless prefetched)
      SL_RETURN_IF_ERROR(WaitUnsharded(u));
    }
    if (bp == BackwardPrefetch::kPre && u - 1 >= 1) Prefetch(u - 1);
    const bool vocab_head = u == model::HeadUnit(m) && head_vocab_parallel_;
    if (vocab_head) grad = std::exchange(head_grad_hidden_, at::Tensor());
    {
      const Timeline::Scope span(timeline_, "backward", unit.name());
      SL_RETURN_IF_ERROR(Backward(u, &grad));
    }
    if (bp == BackwardPrefetch::kPost && u - 1 >= 1) Prefetch(u - 1);
    if (model::IsBlock(m, u)) SL_RETURN_IF_ERROR(ReshardAfterBackward(u, final_micro));
    if (NeedsTable(u)) SL_RETURN_IF_ERROR(units_[0].Reshard());  // (its lookup's backward needs no parameters)
    // A unit is reduced as soon as its gradient is complete: in every
    // micro-batch under sharded accumulation, else in the last one only
    // (earlier ones accumulate unsharded, with no communication). (The
    // embed unit comes last, after the tied lm_head added to wte; a tied
    // table looked up sparsely right after the head, StartTiedTableReduction.)
    const bool reduce = final_micro || reduce_every_micro_;
    // (The vocabulary-parallel head's part of the table's gradient is a
    // shard, added in every micro-batch: the tied table's here, the
    // exchanged head's once its prefix's gradient is summed.)
    if (HeadExchanged(u)) {
      SL_RETURN_IF_ERROR(IssueHeadPrefixGrad(micro, final_micro));
    } else if (FlatParam* f = unit.trainable(); f && reduce) {
      const bool accumulate = reduce_every_micro_ && micro > 0;
      if (u == 1 && last == 0 && sparse_embedding_ && !RowsOverWorld(final_micro)) {
        start_block = [this, f, accumulate, final_micro] { return reduction_->Start(f, accumulate, final_micro); };
      } else {
        SL_RETURN_IF_ERROR(reduction_->Start(f, accumulate, final_micro));
      }
    }
    if (reduce && NeedsTable(u)) SL_RETURN_IF_ERROR(StartTiedTableReduction(micro, final_micro));
    if (vocab_head && tied_sparse_) SL_RETURN_IF_ERROR(AddHeadTableShard(micro, final_micro));
    // Sharded accumulation keeps one reduction in flight, so that a rank's
    // gradient memory stays near two units whatever the model.
    if (reduce) SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/false, reduce_every_micro_ ? 1 : SIZE_MAX));
    if (head_prefix_grad_work_ && u < model::HeadUnit(m)) SL_RETURN_IF_ERROR(FinishHeadShard(micro, final_micro));
  }
  if (head_prefix_grad_work_) SL_RETURN_IF_ERROR(FinishHeadShard(micro, final_micro));  // (a model of no blocks)
  for (int u = 0; u < last; ++u) TrackActivation(units_[u].Take().output, false);  // (no backward ran)
  SL_RETURN_IF_ERROR(units_[0].Reshard());
  return units_[model::HeadUnit(m)].Reshard();
}

absl::Status Engine::ReshardAfterBackward(int u, bool final_micro) {
  Unit& unit = units_[u];
  if (u != 1) return unit.Reshard();
  // The first block is the next forward's first gather. Between micro-batches
  // its parameters do not change: it stays gathered (one all-gather fewer per
  // micro-batch after the first). After the last, where another step
  // follows, a frozen base (LoRA's) stays too; what trains is gathered again
  // after its update (OptimizerStep). The window's count is unchanged: the
  // forward holds this block while it prefetches the next ones anyway.
  if (!final_micro) return absl::OkStatus();
  return next_step_follows_ ? unit.ReshardTrainable() : unit.Reshard();
}

Packing Engine::PackingOf(const at::Tensor& positions) const {
  return positions.defined() ? Packing::FromPositions(positions, device_->FromHost(positions)) : Packing();
}

absl::Status Engine::ForwardBackward(const at::Tensor& x, const at::Tensor& y, const Packing& packing, int micro,
                                     bool final_micro, at::Tensor* loss) {
  packing_ = packing;  // (a checkpointed block recomputes with it in backward)
  {
    // (`out` shares the head's output storage: gone before backward frees it.)
    SL_ASSIGN_OR_RETURN(const at::Tensor out, ForwardUnits({ForwardPass::kTrain, y, loss_scale_, packing}, x));
    // Summed on the device; the host reads the loss once, at the step's end.
    *loss = *loss + out.to(at::kDouble);
  }
  // Under sharded accumulation the previous micro-batch's reductions read
  // the full gradients this backward would accumulate into: they end (and
  // free them) first, having overlapped this forward.
  if (reduce_every_micro_ && micro > 0) SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/true));
  return BackwardUnits(micro, final_micro);
}

}  // namespace shardline
