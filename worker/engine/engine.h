// Engine: one rank's training loop over sharded units. It owns the FlatParams,
// runs docs/design.md's step schedule (gather, forward, free; gather, backward,
// free, reduce-scatter; clip; optimizer on the local shard) on its Device and
// counts what it holds and moves.
//
// The model is a list of Units (unit.h): each unit's FlatParams, gathered,
// used and freed together. One forward schedule over them (ForwardUnits:
// gather, prefetch, compute, free) serves training, evaluation and Logits.
//
// Groups and communicators come from worker/comm/groups.h; the engine never
// knows which backend runs. On a CUDA device the step computes on the
// device's compute stream, orders it after collectives with device-side
// waits, and synchronises the host once per step, to read the loss and the
// gradient norm.
//
// Under LoRA ([lora]) every unit's base parameters are a frozen FlatParam
// (sharded and gathered per use, or replicated: [lora] base) and each block
// with adapters has a trainable FlatParam of them that the strategy shards
// like any unit. Gradient reduction, clipping, the optimizer and checkpoints
// see the trainable FlatParams only ("trainable units": every unit without
// LoRA, the "<unit>.lora" adapter units with it).
//
// Errors: Step returns the first error of any collective (naming the op and
// rank); after an error the engine must not be stepped again.
// Threading: one thread drives the engine; collectives run on the
// communicators' own threads or streams, which is how prefetch overlaps
// compute.
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "common/model/model_shapes.h"
#include "common/model/shard_layout.h"
#include "common/model/weight_source.h"
#include "worker/comm/comm_waiter.h"
#include "worker/comm/communicator.h"
#include "worker/comm/groups.h"
#include "worker/data/token_dataset.h"
#include "worker/device/device.h"
#include "worker/engine/flat_param.h"
#include "worker/engine/grad_reduction.h"
#include "worker/engine/sparse_embedding.h"
#include "worker/engine/step_result.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/unit.h"
#include "worker/engine/vocab_parallel_head.h"
#include "worker/model/family.h"

namespace shardline {

// The torch dtype of a job's DType.
at::ScalarType TorchDType(DType d);

// Per-rank memory by kind; at rest (between steps) and the peak of all kinds
// together during the last step.
struct MemoryReport {
  std::array<int64_t, kNumMemKinds> bytes{};
  std::array<int64_t, kNumMemKinds> peak_by_kind{};
  int64_t state_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t activation_peak_bytes = 0;
  int64_t init_peak_bytes = 0;  // peak while the model was built
  // Measured by the device's allocator (TensorMemory on CPU, the caching
  // allocator on CUDA): every tensor byte at the peak of the last step,
  // activations and temporaries included, and what the allocator reserved.
  int64_t tensor_peak_bytes = 0;
  int64_t reserved_peak_bytes = 0;
  int64_t Of(MemKind k) const { return bytes[static_cast<int>(k)]; }
};

// What the caller tells Engine::Step beside the step number.
struct StepOptions {
  // This rank asks for a checkpoint after this step (a time interval ran
  // out, a user asked); the votes ride on the step's one all-reduce, so
  // every rank learns the same StepResult::save without a collective of
  // its own.
  bool vote_save = false;
  // The caller runs step + 1 next, on every rank: the first block's
  // all-gather for it is issued during this step's update, where the link
  // is idle, and is in flight (then held, a block) until that step's
  // forward; a frozen base (LoRA's) stays gathered from this step's
  // backward instead. Every rank must pass the same; a caller that then
  // stops instead only leaves one gather to complete.
  bool next_step_follows = false;
};

class Engine {
 public:
  // Builds the model one unit at a time on `device` (peak: this rank's
  // shards plus one unit) and opens the data. `config` must have passed
  // ValidateJobConfig; `comms` must match PlanGroups and live on `device`.
  // `collective_timeout` bounds every wait on a collective and the host's
  // wait for the device.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const JobConfig& config, int rank, int world,
                                                        std::shared_ptr<const Device> device, Communicators comms,
                                                        absl::Duration collective_timeout = absl::Seconds(60));
  ~Engine();

  // Runs global step `step` (0-based): every micro-batch, then the update,
  // then (every [train] eval_interval steps, and after the last) Evaluate.
  absl::StatusOr<StepResult> Step(int64_t step, StepOptions options = {});
  // The mean loss over the first eval_batches global batches of [data]
  // val_path, forward only (every rank must call it). Masked validation
  // files count their masked-in targets only.
  absl::StatusOr<double> Evaluate();
  // The first half of Step: forward and backward of every micro-batch and the
  // gradient reduction; returns this rank's share of the mean loss (the
  // global mean when world == 1). Afterwards GradShard (where the optimizer
  // is not sharded across replicas: there it is the replicas' scratch)
  // holds the reduced (unclipped) gradient.
  absl::StatusOr<double> ComputeGradients(int64_t step);
  // Trainable unit `i` (an index into trainable_layouts()).
  const at::Tensor& GradShard(int i) const { return trainable_[i]->grad_shard(); }
  const Device& device() const { return *device_; }
  // Records the steps' spans from now on (worker/comm/timeline.h: each
  // unit's forward and backward, the optimizer, every wait on a
  // collective); `timeline` must outlive the engine, or be reset to null.
  void set_timeline(Timeline* timeline) {
    timeline_ = timeline;
    waiter_.set_timeline(timeline);
  }

  int rank() const { return rank_; }
  int world() const { return world_; }
  int shard_group_size() const { return comms_.shard->size(); }
  // The layouts of the trainable units, in order (the ownership map of what
  // checkpoints hold).
  const std::vector<ShardLayout>& trainable_layouts() const { return trainable_layouts_; }
  MemoryReport Memory() const;
  comm::CommStats ShardCommStats() const { return comms_.shard->Stats(); }
  comm::CommStats ReplicateCommStats() const { return comms_.replicate->Stats(); }

  // The full master parameters of trainable unit `i` (padded, on the host,
  // as fp32 whatever the master dtype), gathered from the shard group. Every rank of the shard group must call
  // it, in the same order.
  absl::StatusOr<at::Tensor> GatherUnitMaster(int i);
  // This rank's optimizer state of trainable unit `i`: master, Adam m and
  // v, on the engine's device: views of the live state in the [optimizer]
  // dtypes, or (8-bit moments) their values in fp32 copies. They hold the unit's flat elements from
  // ShardStateOffset(i), trainable_layouts()[i].shard_numel of them, or,
  // with the optimizer sharded across the replicas, this rank's piece of
  // them (FlatParam::owned_numel() long, of which ShardStateNumel(i) lie
  // in the shard: the rest is padding).
  // `encoded`: the moments' own representation where it is not their
  // values (AdamWState::Encode: 8-bit codes), on the host; empty for dense
  // moments and where the optimizer is sharded across the replicas.
  struct ShardState {
    at::Tensor master, exp_avg, exp_avg_sq;
    AdamWState::Encoded encoded;
  };
  ShardState Shard(int i) const {
    const FlatParam& f = *trainable_[i];
    return {f.master(), f.optimizer()->exp_avg(), f.optimizer()->exp_avg_sq(), ShardEncoding(i)};
  }
  // Shard(i)'s length and its `encoded`, without the moments' values (which
  // 8-bit moments dequantize).
  int64_t ShardLength(int i) const { return trainable_[i]->owned_numel(); }
  AdamWState::Encoded ShardEncoding(int i) const {
    const FlatParam& f = *trainable_[i];
    return f.replica_sharded() ? AdamWState::Encoded() : f.optimizer()->Encode();
  }
  // Sets that state to a checkpoint's `values` (fp32, Shard(i)'s lengths,
  // on any device; `encoded`, where given, Shard(i)'s of a state over the
  // same range, read back exactly). Then PublishLoadedState.
  absl::Status LoadShardState(int i, const ShardState& values) {
    return trainable_[i]->LoadState(values.master, values.exp_avg, values.exp_avg_sq, values.encoded);
  }
  int64_t ShardStateOffset(int i) const;
  int64_t ShardStateNumel(int i) const;
  // This rank's whole shard of that state, shard_numel long, as checkpoints
  // save it: Shard(i), or where the optimizer is sharded across the
  // replicas, every replica's piece gathered into new tensors (every rank of
  // the replicate group must call it, in the same order).
  absl::StatusOr<ShardState> WholeShard(int i);
  int shard_rank() const { return comms_.shard->rank(); }
  // After the shards' master values were replaced (a checkpoint was loaded):
  // refresh the parameters every rank computes with. All ranks must call it.
  absl::Status PublishLoadedState();
  // The logits [B, T, vocab] of `inputs` (token ids [B, T], on the host),
  // forward only through the same unit schedule as training, in the compute
  // dtype; returned on the host. Every rank of the shard group must call it.
  // `positions` (TokenDataset::Batch's, undefined: none): packed documents.
  absl::StatusOr<at::Tensor> Logits(const at::Tensor& inputs, const at::Tensor& positions = {});

 private:
  // What one pass of ForwardUnits computes.
  struct ForwardPass {
    enum Kind {
      kTrain,     // the loss, keeping activations for backward
      kEvaluate,  // the loss, forward only
      kLogits,    // the logits, forward only
    };
    Kind kind;
    at::Tensor targets;     // kTrain, kEvaluate: on the device
    double loss_scale = 0;  // kTrain, kEvaluate
    Packing packing;        // documents packed in the sequences (none: undefined)
    bool train() const { return kind == kTrain; }
  };

  Engine(const JobConfig& config, int rank, int world, std::shared_ptr<const Device> device, Communicators comms,
         absl::Duration timeout);
  absl::Status Init();
  // Forward and backward of every micro-batch of `step`, the gradient
  // reductions started (the last may still run: Pump(wait_all) waits);
  // returns this rank's summed loss as a device scalar (fp64).
  absl::StatusOr<at::Tensor> ForwardBackwardAll(int64_t step);
  // The packing of a micro-batch from TokenDataset::Batch's positions
  // (undefined: none), on the compute device.
  Packing PackingOf(const at::Tensor& positions) const;
  absl::Status ForwardBackward(const at::Tensor& x, const at::Tensor& y, const Packing& packing, int micro,
                               bool final_micro, at::Tensor* loss);
  // The one forward schedule: for each unit in order, unshard and wait,
  // prefetch the next, compute, reshard what no backward needs. Returns the
  // head's output without its graph: the scaled loss sum, or the logits.
  absl::StatusOr<at::Tensor> ForwardUnits(const ForwardPass& pass, at::Tensor h);
  // Unit u's output for input h; training keeps what backward needs.
  at::Tensor UnitForward(int u, const at::Tensor& h, const ForwardPass& pass);
  at::Tensor UnitOutput(int u, const at::Tensor& h, const ForwardPass& pass) const;
  // Backward of every unit in reverse order (after ForwardUnits' training
  // pass); the last micro-batch starts each unit's gradient reduction.
  absl::Status BackwardUnits(int micro, bool final_micro);
  // The embed unit through SparseEmbedding ([parallelism] sparse_embedding):
  // the rows of token ids `ids` (training keeps what its backward needs),
  // and that backward given the gradient of those rows. `start_block` (may
  // be empty) runs once the rows' exchange is issued (the first block's
  // reduction, queued behind it: BackwardUnits).
  absl::StatusOr<at::Tensor> EmbedSparse(const at::Tensor& ids, const ForwardPass& pass);
  absl::Status BackwardSparseEmbed(int micro, bool final_micro, const at::Tensor& grad,
                                   const std::function<absl::Status()>& start_block);
  // Whether the sparse rows' gradient is exchanged over the world (every
  // replica's rows) in this micro-batch.
  bool RowsOverWorld(bool final_micro) const;
  // A tied table looked up sparsely, the head's part of its gradient:
  // gathered head, its reduction starts right after the head's backward, so
  // that it overlaps every block's backward instead of ending the step;
  // vocabulary-parallel head, the shard it computed is added (every
  // micro-batch).
  absl::Status StartTiedTableReduction(int micro, bool final_micro);
  absl::Status AddHeadTableShard(int micro, bool final_micro);
  // The vocabulary-parallel head over the world (hybrid strategies): its
  // part of the table's gradient is summed over the micro-batches and
  // all-gathered across the replicas after the last one's head (overlapping
  // the blocks' backward; issued before any block's all-reduce, on every
  // rank), then added into the shard at the end of backward: tied, after
  // the lookup's rows, which are every replica's; untied, with the norm's
  // gradient summed over the micro-batches and then across the replicas.
  // Nothing all-reduces the table's shard.
  absl::Status AddHeadTablePart(int micro, bool final_micro);
  absl::Status FinishHeadTableParts();
  // The head's loss through VocabParallelHead (head_vocab_parallel_): the
  // final norm of x, then the loss over the table's shards; training keeps
  // the norm's graph and the gradients it computed (head_grad_*). `issue`:
  // backward's prefetch, VocabParallelHead::Run's.
  absl::StatusOr<at::Tensor> HeadVocabParallel(const at::Tensor& x, const ForwardPass& pass,
                                               const std::function<void(int)>& issue);
  // Whether unit u is the untied head under the vocabulary-parallel head:
  // exchanged (its prefix summed), not gathered.
  bool HeadExchanged(int u) const;
  // The prefix's exchange: issued (where the head would be gathered),
  // waited for. The sum is kept across passes until the head's shard
  // changes (the optimizer, a checkpoint's load): ForgetHeadPrefix.
  void IssueHeadPrefix();
  absl::Status WaitHeadPrefix();
  void ForgetHeadPrefix();
  // After the exchanged head's backward: starts summing its prefix's
  // gradient over the group; FinishHeadShard (a unit later, when the sum is
  // long done) adds it and the table's rows' gradient into the head's shard
  // (over the world, sums the prefix's over the micro-batches instead).
  absl::Status IssueHeadPrefixGrad(int micro, bool final_micro);
  absl::Status FinishHeadShard(int micro, bool final_micro);
  // Backward of unit u given the gradient of its output (undefined for the
  // head); leaves the gradient of its input in *grad.
  absl::Status Backward(int u, at::Tensor* grad);
  absl::Status InitUnit(int u, const WeightSource* weights, const WeightSource* adapters);
  // A block's projection matrices in NF4 ([lora] base_dtype = "nf4"): takes
  // them out of `params` (the unit's, which keeps the dense rest) and
  // quantizes them for `rank` of a shard group of `group`.
  absl::StatusOr<std::unique_ptr<Nf4Base>> QuantizeBlockBase(int u, const WeightSource* weights, int group, int rank,
                                                             std::vector<ParamSpec>* params);

  // Starts unit u's all-gathers unless max_inflight_all_gathers are in flight.
  void Prefetch(int u);
  // Unit u's unshard and wait (unit.h), with the embed unit's where u is the
  // head of a tied table looked up sparsely (NeedsTable): the table is
  // gathered for the head alone, behind the blocks' forward, not first.
  void Unshard(int u);
  absl::Status WaitUnsharded(int u);
  bool NeedsTable(int u) const;
  int inflight_gathers() const;

  // The step's sums, in one all-reduce (fp64 device [3]): the squared
  // global gradient norm (over the shard group, which holds the reduced
  // gradient once), this rank's loss share and save vote (over the world).
  // Waits for the gradient reductions still running.
  absl::StatusOr<at::Tensor> StepSums(const at::Tensor& loss, bool vote_save);
  // AdamW on every trainable shard; with `prefetch_first_block` (unit 1 is
  // a block), that block's shard first, then its gather for the next step.
  absl::Status OptimizerStep(int64_t step, double lr, const at::Tensor& clip_coef, bool prefetch_first_block);
  // After unit u's backward: frees a block's gathered parameters, but the
  // first block's where they do not change before the next forward gathers
  // them again.
  absl::Status ReshardAfterBackward(int u, bool final_micro);
  // Waits for every gather in flight and frees it (a checkpoint's load
  // replaces the parameters a prefetch read).
  absl::Status DropGathers();
  absl::Status AllGatherPersistentParams();
  // `piece` (fp32, f's owned piece of some state) gathered across the
  // replicas into f's whole shard, where f's optimizer is sharded across
  // them; otherwise `piece` itself.
  absl::StatusOr<at::Tensor> WholeShardOf(const FlatParam& f, const at::Tensor& piece);
  absl::Status SumOverWorld(at::Tensor t);
  // The host's one wait per step, then a check that no communicator failed
  // asynchronously meanwhile.
  absl::Status SyncHost();
  void TrackActivation(const at::Tensor& t, bool add);

  const JobConfig config_;
  const int rank_, world_;
  const std::shared_ptr<const Device> device_;
  const std::unique_ptr<ModelFamily> family_;
  Communicators comms_;
  CommWaiter waiter_;
  std::unique_ptr<TokenDataset> data_;
  std::unique_ptr<TokenDataset> val_;  // null without [data] val_path
  std::vector<Unit> units_;  // in model order
  // Derived from units_ once they are built (Init): each unit's trainable
  // FlatParam in unit order (the order of checkpoints and the optimizer),
  // and its layout.
  std::vector<FlatParam*> trainable_;
  std::vector<ShardLayout> trainable_layouts_;
  std::unique_ptr<GradReduction> reduction_;
  // Where the embedding's parameters are sharded and the job asks; tied, the
  // head gathers the table (NeedsTable), or, where that moves fewer bytes
  // (comm::VocabParallelBeatsGather), computes its loss where the table's
  // rows lie (vocab_head_) in passes that want a loss
  // (head_vocab_parallel_, set by ForwardUnits).
  std::unique_ptr<SparseEmbedding> sparse_embedding_;
  bool tied_sparse_ = false;
  std::unique_ptr<VocabParallelHead> vocab_head_;
  bool head_vocab_parallel_ = false;
  // Untied (the llama's lm_head), the table is the head unit's own, so under
  // the vocabulary-parallel head that unit is never gathered: its
  // parameters before the table (the final norm: its "prefix") are summed
  // over the group from the rank that holds them instead (every other rank
  // adds zeros), where Unshard would gather, and their gradient, each
  // rank's tokens', is summed likewise after the head's backward.
  bool head_holds_table_ = false;
  // The unit whose parameters hold the vocabulary-parallel head's table.
  const Unit& TableHolder() const { return units_[head_holds_table_ ? model::HeadUnit(config_.model) : 0]; }
  int64_t head_prefix_numel_ = 0;
  at::Tensor head_prefix_;  // summed, until the shard changes
  std::shared_ptr<comm::Work> head_prefix_work_;
  at::Tensor head_prefix_leaf_;  // training: the prefix the head's graph starts at
  at::Tensor head_prefix_grad_;  // being summed (head backward .. FinishHeadShard)
  std::shared_ptr<comm::Work> head_prefix_grad_work_;
  // What the vocabulary-parallel head computed in a training forward, for
  // its backward: dL/dh of the final norm's output, and the table's gradient
  // shard (undefined where the table is frozen).
  at::Tensor head_grad_hidden_, head_grad_table_;
  // Over the world: this rank's part's gradient over the micro-batches, and
  // every replica's, being gathered (last head .. FinishHeadTableParts).
  at::Tensor head_part_grad_, head_parts_;
  at::Tensor head_prefix_grad_sum_;  // untied: the group's prefix gradient over the micro-batches
  std::shared_ptr<comm::Work> head_parts_work_;
  // The lookup's row gradients are gathered across replicas too, instead of
  // the table's shard being all-reduced (SparseEmbedding::RowsBeatAllReduce).
  bool world_rows_ = false;
  MemoryLedger ledger_;
  int64_t activation_peak_ = 0;
  bool next_step_follows_ = false;  // the Step in progress's StepOptions
  double optimizer_seconds_ = 0;  // the last OptimizerStep's update (StepResult::optimizer_seconds)
  Packing packing_;               // the micro-batch's that backward recomputes with (ForwardBackward)
  int64_t init_peak_ = 0;
  int64_t tensor_peak_ = 0, reserved_peak_ = 0;
  double loss_scale_ = 0;
  Timeline* timeline_ = nullptr;  // not owned; null: no spans
  // Sharded gradient accumulation (GradAccumulation::kSharded under a
  // strategy that shards gradients): every micro-batch is reduced.
  bool reduce_every_micro_ = false;
};

}  // namespace shardline
