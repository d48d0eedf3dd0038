// FlatParam: every tensor the engine keeps for one unit, and the explicit
// state of its unsharded parameters.
//
//   master                        master dtype [shard]   this rank's master
//                                 parameters (where the master dtype is the
//                                 param dtype, master aliases the parameters)
//   optimizer                     AdamWState: Adam's m and v, moments dtype [shard]
//                                 (or 8 bits in blocks: AdamW8BitState)
//   param_shard                   param dtype [shard]   all-gather input
//                                 (ZeRO-3 family only; aliases master where
//                                 their dtypes agree)
//   unsharded                     param dtype [padded]  the gathered unit
//   grad_full                     param dtype [padded]  autograd's target
//   grad_shard                    reduce dtype [shard]  the shard group's reduction
//
// With the optimizer sharded across R replicas (FlatParamOptions::
// optimizer_shards = R > 1, ZeRO-3 family only), the shard is cut into R
// pieces of owned = ceil(shard / R) (the last padded past the shard), and
// replica r owns piece r: master and the optimizer's moments are [owned];
// param_shard and grad_shard live in [R * owned] buffers (the replicas'
// collectives need equal pieces); grad_owned, this rank's piece of the
// gradient's buffer, is where the replicas' reduce-scatter leaves the sum
// (in place) and what the optimizer reads. After an update the pieces are
// all-gathered across the replicas (GatherOverReplicas), and the next
// Unshard's gather is queued after it.
//
// `weights` are autograd leaves that view `unsharded`'s storage, and their
// .grad tensors view `grad_full`'s storage. Freeing releases the storage's
// memory but keeps the storage object (FSDP's resize-to-zero), so the leaves,
// and any autograd graph that saved them, see the data again once it is
// re-gathered. The leaves have their own version counters, so refilling the
// buffer does not look like an in-place edit to autograd.
//
// A frozen FlatParam (FlatParamOptions::trainable false: LoRA's base) keeps
// only its parameters: param_shard (sharded) or unsharded (persistent), in
// the param dtype; no master, no optimizer state, no gradient storage, and
// its weights do not require grad. A unit's frozen and trainable parameters
// never share a FlatParam, so dtype and requires_grad are uniform in each.
//
// Unshard life cycle (FSDP2's unshard / wait_for_unshard / reshard), for the
// ZeRO-3 family whose parameters are sharded between uses:
//
//   kSharded --Unshard--> kGathering --WaitForUnshard--> kUnsharded --Reshard--> kSharded
//
// Repeating a transition is a no-op (Unshard while gathering or unsharded,
// WaitForUnshard when unsharded, Reshard when sharded). WaitForUnshard with
// no gather issued, and Reshard while a gather is in flight (its buffer is
// still being written), are errors. Where parameters persist (ZeRO 0-2) the
// state is always kUnsharded and Unshard / Reshard do nothing.
//
// Memory lives on the rank's Device, which makes every allocation; each
// allocation and free is recorded in the MemoryLedger by kind. Freeing after
// a device-side wait is safe without recordStream: the caching allocator
// reuses the memory only for work ordered after the free.
// Not thread-safe: owned and driven by the engine's step thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "common/model/shard_layout.h"
#include "worker/comm/comm_waiter.h"
#include "worker/comm/communicator.h"
#include "worker/device/device.h"
#include "worker/engine/optimizer.h"

namespace shardline {

enum class MemKind { kParams = 0, kGrads, kMaster, kOptimizer, kActivations };
constexpr int kNumMemKinds = 5;
const char* MemKindName(MemKind k);

// Bytes held by kind, now and at peak (all kinds together).
class MemoryLedger {
 public:
  void Add(MemKind k, int64_t bytes);
  void Sub(MemKind k, int64_t bytes) { Add(k, -bytes); }
  int64_t current(MemKind k) const { return current_[static_cast<int>(k)]; }
  int64_t total() const { return total_; }
  int64_t peak() const { return peak_; }
  int64_t peak(MemKind k) const { return peak_by_kind_[static_cast<int>(k)]; }
  void ResetPeak() {
    peak_ = total_;
    peak_by_kind_ = current_;
  }

 private:
  std::array<int64_t, kNumMemKinds> current_{}, peak_by_kind_{};
  int64_t total_ = 0, peak_ = 0;
};

enum class UnshardState { kSharded, kGathering, kUnsharded };

struct FlatParamOptions {
  at::ScalarType param_dtype = at::kFloat;
  at::ScalarType reduce_dtype = at::kFloat;
  // The optimizer's state ([optimizer] master_dtype / moments_dtype): fp32
  // both, bf16 both with a bf16 param dtype (then master is the params), or
  // kByte moments: 8 bits in blocks (AdamW8BitState, host memory only).
  at::ScalarType master_dtype = at::kFloat;
  at::ScalarType moments_dtype = at::kFloat;
  bool persistent_params = true;  // unsharded kept between steps (ZeRO 0-2)
  bool persistent_grads = true;   // grad_full kept between steps (ZeRO 0-1)
  bool trainable = true;          // false: frozen (see above)
  int optimizer_shards = 1;       // R: replicas the optimizer is sharded across (see above)
  int optimizer_rank = 0;         // this rank's piece, in [0, R)
};

// A unit's initial fp32 values: writes flat[begin, begin + out.numel())
// into `out` (fp32, contiguous, on the host), the padding zero. FlatParam
// asks for the range it keeps in increasing, bounded pieces
// (FlatParam::kInitChunk elements at most), so no rank holds a whole unit in
// fp32 while it loads.
using InitValues = std::function<absl::Status(int64_t begin, at::Tensor out)>;

class FlatParam {
 public:
  static constexpr int64_t kInitChunk = int64_t{16} << 20;

  // Allocates the persistent state for `shard_rank` of layout.group_size on
  // `device` and fills master (and param_shard / unsharded) from `init`,
  // which is asked only for the range this rank keeps: the whole unit where
  // parameters persist unsharded, else its shard. `device` and `ledger` must
  // outlive the FlatParam. The state dtypes are a pair AdamWUpdate runs
  // (ValidateJobConfig refuses others). Errors: those of `init`.
  static absl::StatusOr<std::unique_ptr<FlatParam>> Create(ShardLayout layout, int shard_rank,
                                                           const FlatParamOptions& options, const Device& device,
                                                           MemoryLedger* ledger, const InitValues& init);
  // InitValues from a whole unit's values already in memory (fp32,
  // layout.padded_numel or shorter: the rest reads as zero).
  static InitValues ValuesOf(at::Tensor full);
  ~FlatParam();
  FlatParam(const FlatParam&) = delete;
  FlatParam& operator=(const FlatParam&) = delete;

  const ShardLayout& layout() const { return layout_; }
  int shard_rank() const { return shard_rank_; }
  const FlatParamOptions& options() const { return options_; }

  // The unshard life cycle (see above). Unshard allocates the unsharded
  // buffer and starts its all-gather on `shard_group`; WaitForUnshard makes
  // the compute stream wait for it; Reshard frees the buffer.
  // (With the optimizer sharded across replicas, queued after the pieces'
  // gather across them.)
  void Unshard(comm::Communicator& shard_group);
  absl::Status WaitForUnshard(CommWaiter& waiter);
  absl::Status Reshard();
  UnshardState state() const { return state_; }
  bool unsharded_allocated() const { return unsharded_.storage().nbytes() > 0; }

  // Gradient storage: allocated zeroed on first use in a step.
  void EnsureGrad();
  void FreeGrad();
  void ZeroGrad();
  bool grad_allocated() const { return grad_full_.defined() && grad_full_.storage().nbytes() > 0; }

  bool trainable() const { return options_.trainable; }
  // The slice of the unsharded buffer this rank owns.
  at::Tensor OwnChunk(const at::Tensor& full) const {
    return full.narrow(0, layout_.ShardOffset(shard_rank_), layout_.shard_numel);
  }
  // After master changed (an optimizer step, a loaded checkpoint): refresh
  // param_shard (ZeRO-3) or this rank's chunk of the persistent unsharded
  // buffer (ZeRO 0-2).
  void PublishMaster();
  // A checkpoint's values of this rank's master and moments (the owned
  // range's length, any device), converted into their dtypes (the engine
  // then publishes them: Engine::PublishLoadedState). Trainable only.
  // `encoded` (if not empty): the moments' own representation, as
  // AdamWState::LoadEncoded takes it; refused (InvalidArgument) if it does
  // not fit this state.
  absl::Status LoadState(const at::Tensor& master, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                         const AdamWState::Encoded& encoded = {});
  // One AdamW step of this rank's shard from optimizer_grad() (times
  // `clip_coef`, an fp32 scalar on the device), then PublishMaster.
  // Trainable only; sharded across replicas, after WaitForReplicaGather.
  void OptimizerStep(const AdamWStep& s, const at::Tensor& clip_coef);

  // The optimizer sharded across replicas (optimizer_shards > 1).
  bool replica_sharded() const { return options_.optimizer_shards > 1; }
  // Where this rank's master and moments lie in its shard, and how many
  // (the whole shard unless replica_sharded; the last piece may reach past
  // the shard into padding, which stays zero).
  int64_t owned_offset() const { return owned_offset_; }
  int64_t owned_numel() const { return owned_numel_; }
  // Replica-sharded: all-gathers the updated pieces of param_shard across
  // `replicate` (the next Unshard, or WaitForReplicaGather, waits for it).
  void GatherOverReplicas(comm::Communicator& replicate);
  absl::Status WaitForReplicaGather(CommWaiter& waiter);
  // Replica-sharded: the [R * owned] buffer that holds grad_shard (the
  // replicas' reduce-scatter input; its padding is zeroed here) and its
  // piece the reduce-scatter writes (grad_owned).
  at::Tensor ReplicaReduceInput();
  const at::Tensor& grad_owned() const { return grad_owned_; }
  // The gradient the optimizer reads: grad_owned, or grad_shard.
  const at::Tensor& optimizer_grad() const { return replica_sharded() ? grad_owned_ : grad_shard_; }

  // This rank's state, trainable FlatParams only (undefined or null when
  // frozen). The tensors are the live ones: a checkpoint loads by copying
  // into them (then PublishMaster); the reduction writes grad_shard.
  const at::Tensor& master() const { return master_; }
  const at::Tensor& grad_shard() const { return grad_shard_; }
  const AdamWState* optimizer() const { return optimizer_.get(); }
  // Sharded gradient accumulation: a later micro-batch's reduced shard
  // (reduce dtype) added to grad_shard on the compute stream.
  void AddToGradShard(const at::Tensor& reduced) { grad_shard_.add_(reduced); }

  // This rank's shard of the parameters in the param dtype (sharded-params
  // strategies; undefined where parameters persist unsharded).
  const at::Tensor& param_shard() const { return param_shard_; }
  const at::Tensor& unsharded() const { return unsharded_; }
  const at::Tensor& grad_full() const { return grad_full_; }
  const std::vector<at::Tensor>& weights() const { return weights_; }

 private:
  FlatParam(ShardLayout layout, int shard_rank, const FlatParamOptions& options, const Device& device,
            MemoryLedger* ledger);
  // Fills the kept range from `init`, chunk by chunk (see InitValues).
  absl::Status LoadInitial(const InitValues& init);
  // Writes `values` (fp32) at `at` in the shard into the shard's own tensors.
  void CopyIntoShard(int64_t at, const at::Tensor& values);
  at::Tensor NewTensor(int64_t numel, at::ScalarType dtype, MemKind kind);
  void AllocUnsharded();
  void FreeUnsharded();
  // Replica-sharded: the pieces' buffers (zero), master and grad_owned; and
  // the decay ranges of the shard that fall in this piece.
  void AllocReplicaPieces();
  std::vector<DecayRange> OwnedDecayRanges(const std::vector<DecayRange>& in_shard) const;

  const ShardLayout layout_;
  const int shard_rank_;
  const FlatParamOptions options_;
  const Device& device_;
  MemoryLedger* const ledger_;
  at::Tensor unsharded_, grad_full_;
  at::Tensor master_, grad_shard_;
  at::Tensor param_shard_;  // defined for sharded-params strategies
  std::unique_ptr<AdamWState> optimizer_;
  std::vector<at::Tensor> weights_;
  UnshardState state_ = UnshardState::kSharded;
  std::shared_ptr<comm::Work> gather_;  // while kGathering
  // Replica-sharded (see above): the [R * owned] buffers param_shard and
  // grad_shard are views of, the piece this rank owns, and the gather of
  // the updated pieces until an Unshard or a wait took it.
  at::Tensor param_pieces_, grad_pieces_, grad_owned_;
  int64_t owned_offset_ = 0, owned_numel_ = 0;
  std::shared_ptr<comm::Work> replica_gather_, gather_after_;
};

}  // namespace shardline
