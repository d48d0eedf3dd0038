// Engine: one rank's training loop over sharded units. It owns the FlatParams,
// runs DESIGN.md's step schedule (gather, forward, free; gather, backward,
// free, reduce-scatter; clip; optimizer on the local shard) and counts what it
// holds and moves.
//
// Groups: the world of R ranks is split into shard groups of G consecutive
// ranks (state is sharded over a shard group) and replicate groups of the
// ranks with the same position in every shard group (gradients are all-reduced
// across them). ZeRO strategies have G = R, no_shard G = 1, the hybrid ones
// the configured shard_group_size. The caller connects both communicators.
//
// Errors: Step returns the first error of any collective (naming the op and
// rank); after an error the engine must not be stepped again.
// Threading: one thread drives the engine; collectives run on the
// communicators' own threads, which is how prefetch overlaps compute.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "common/shard_layout.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/data/token_dataset.h"
#include "worker/engine/flat_param.h"
#include "worker/engine/optimizer.h"
#include "worker/model/gpt.h"

namespace shardline {

struct StepResult {
  int64_t step = 0;
  double loss = 0;        // mean cross-entropy over the global batch
  double grad_norm = 0;   // before clipping
  double lr = 0;
  int64_t tokens = 0;     // tokens of the global batch
  double seconds = 0;
  double exposed_comm_seconds = 0;  // time the step thread waited on collectives
};

struct Communicators {
  std::unique_ptr<comm::Communicator> shard;      // size G
  std::unique_ptr<comm::Communicator> replicate;  // size R / G
};

// Per-rank memory by kind; at rest (between steps) and the peak of all kinds
// together during the last step.
struct MemoryReport {
  std::array<int64_t, kNumMemKinds> bytes{};
  std::array<int64_t, kNumMemKinds> peak_by_kind{};
  int64_t state_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t activation_peak_bytes = 0;
  int64_t init_peak_bytes = 0;  // peak while the model was built
  // Measured by the allocator (worker/engine/tensor_memory.h): every CPU
  // tensor byte of the process at the peak of the last step, activations and
  // temporaries included.
  int64_t tensor_peak_bytes = 0;
  int64_t Of(MemKind k) const { return bytes[static_cast<int>(k)]; }
};

class Engine {
 public:
  // Builds the model one unit at a time (peak: this rank's shards plus one
  // unit) and opens the data. `config` must have passed ValidateJobConfig.
  // `collective_timeout` bounds every wait on a collective.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const JobConfig& config, int rank, int world,
                                                        Communicators comms,
                                                        absl::Duration collective_timeout = absl::Seconds(60));
  ~Engine();

  // Runs global step `step` (0-based): every micro-batch, then the update.
  absl::StatusOr<StepResult> Step(int64_t step);
  // The first half of Step: forward and backward of every micro-batch and the
  // gradient reduction; returns this rank's share of the mean loss (the
  // global mean when world == 1). Afterwards GradShard
  // holds the reduced (unclipped) gradient.
  absl::StatusOr<double> ComputeGradients(int64_t step);
  const at::Tensor& GradShard(int unit) const { return units_[unit]->grad_shard; }

  int rank() const { return rank_; }
  int world() const { return world_; }
  int shard_group_size() const { return comms_.shard->size(); }
  const std::vector<ShardLayout>& layouts() const { return layouts_; }
  MemoryReport Memory() const;
  comm::CommStats ShardCommStats() const { return comms_.shard->Stats(); }
  comm::CommStats ReplicateCommStats() const { return comms_.replicate->Stats(); }

  // The full fp32 parameters of one unit (padded), gathered from the shard
  // group. Every rank of the shard group must call it, in the same order.
  absl::StatusOr<at::Tensor> GatherUnitMaster(int unit);
  // This rank's optimizer state of a unit, as checkpoints save and load it:
  // fp32 master, Adam m and v, each layouts()[unit].shard_numel long.
  struct ShardState {
    at::Tensor master, exp_avg, exp_avg_sq;
  };
  ShardState Shard(int unit) const {
    const FlatParam& f = *units_[unit];
    return {f.master, f.exp_avg, f.exp_avg_sq};
  }
  int shard_rank() const { return comms_.shard->rank(); }
  // After the shards' master values were replaced (a checkpoint was loaded):
  // refresh the parameters every rank computes with. All ranks must call it.
  absl::Status PublishLoadedState();

 private:
  struct PendingReduce;
  struct UnitActivation;

  Engine(const JobConfig& config, int rank, int world, Communicators comms, absl::Duration timeout);
  absl::Status Init();
  absl::Status ForwardBackward(const at::Tensor& x, const at::Tensor& y, bool final_micro, double* loss);
  absl::Status Forward(int u, const at::Tensor& input, const at::Tensor& targets);
  // Backward of unit u given the gradient of its output (undefined for the
  // head); leaves the gradient of its input in *grad.
  absl::Status Backward(int u, at::Tensor* grad);
  gpt::Weights WeightsOf(int u) const;

  // Unshard life cycle (ZeRO-3 family; a no-op where params persist).
  void IssueGather(int u);
  absl::Status WaitGather(int u);
  void Prefetch(int u);
  void Reshard(int u);
  int inflight_gathers() const;

  // Gradient reduction of one unit, started after its last backward.
  void StartReduce(int u);
  absl::Status PumpReductions(bool wait_all);
  absl::Status WaitWork(const std::shared_ptr<comm::Work>& w);

  absl::StatusOr<double> GlobalGradNorm();
  absl::Status OptimizerStep(int64_t step, double lr, double clip_coef);
  absl::StatusOr<double> SumOverWorld(double local);
  void TrackActivation(const at::Tensor& t, bool add);

  const JobConfig config_;
  const int rank_, world_;
  Communicators comms_;
  std::unique_ptr<TokenDataset> data_;
  std::vector<ShardLayout> layouts_;
  std::vector<std::unique_ptr<FlatParam>> units_;
  std::vector<std::vector<DecayRange>> decay_;
  std::vector<std::shared_ptr<comm::Work>> gathers_;  // per unit, while kGathering
  std::vector<UnitActivation> acts_;
  std::vector<PendingReduce> pending_;
  MemoryLedger ledger_;
  int64_t activation_peak_ = 0;
  int64_t init_peak_ = 0;
  int64_t tensor_peak_ = 0;
  double exposed_comm_ = 0;
  double loss_scale_ = 0;
  const absl::Duration timeout_;
};

// Decides G for a world and config, and which ranks form this rank's groups.
struct GroupPlan {
  int shard_size = 1, replicate_size = 1;
  int shard_index = 0;      // which shard group (rank / G)
  int shard_rank = 0;       // rank inside it (rank % G)
  std::string shard_name, replicate_name;  // store prefixes
};
GroupPlan PlanGroups(const JobConfig& config, int rank, int world);

// Connects this rank's shard and replicate groups over Gloo through `store`
// (a group of one needs no store and moves nothing).
absl::StatusOr<Communicators> ConnectGlooGroups(const c10::intrusive_ptr<c10d::Store>& store, const GroupPlan& plan,
                                                absl::Duration timeout);

}  // namespace shardline
