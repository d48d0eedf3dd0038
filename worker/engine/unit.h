// Unit: one unit of the model as the step schedules it (FSDP2's
// FSDPParamGroup): the FlatParams that are gathered, used and freed
// together, and what its forward kept for its backward.
//
//   base        every parameter of the unit; frozen under LoRA
//   quantized   a block's projection matrices in NF4 under [lora] base_dtype
//               = "nf4" (then `base` holds its other parameters); else null
//   adapters    the unit's LoRA adapters, trainable; null without LoRA and
//               for a unit LoRA does not target
//   targets     which base weights the adapters apply to (empty without)
//   activation  the input, grad-requiring leaf and output that training's
//               forward keeps until the unit's backward
//
// Unshard life cycle, of both FlatParams together (FlatParam's, see
// flat_param.h, and FSDP2's unshard / wait_for_unshard / reshard):
//
//   Unshard   issues the all-gathers, base first, then quantized, on the
//             shard group (its all-gather stream on a device-ordered backend)
//   Wait      makes the compute stream wait for them (never the host), and
//             dequantizes the quantized matrices on it
//   Reshard   frees the unsharded storage where the strategy shards
//             parameters; a no-op where they persist (ZeRO 0-2, a
//             replicated LoRA base); the dequantized matrices always
//
// Each transition is a no-op when repeated; Wait without Unshard and Reshard
// while a gather is in flight are errors (FlatParam's). The schedule decides
// when (Engine::ForwardUnits and its backward): a Unit only does it.
//
// Not thread-safe: owned and driven by the engine's step thread.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "common/model/model_shapes.h"
#include "worker/comm/comm_waiter.h"
#include "worker/comm/communicator.h"
#include "worker/engine/flat_param.h"
#include "worker/engine/nf4_base.h"
#include "worker/model/family.h"

namespace shardline {

class Unit {
 public:
  // What training's forward keeps for the unit's backward.
  struct Activation {
    at::Tensor input;   // what the unit was given (kept for recomputation)
    at::Tensor leaf;    // the grad-requiring copy of input the graph starts at
    at::Tensor output;  // the unit's output with its graph (unless recomputed)
    at::Tensor all_ids;  // a sparse embedding's lookup: every rank's token ids
  };

  // `base` must be non-null; `adapters` is null without LoRA adapters, and
  // then `targets` is empty. `lora_scaling` is LoRA's alpha / rank.
  // `quantized` (may be null) holds the unit's parameters at its matrices'
  // unit indices, `base` the others in order.
  Unit(std::unique_ptr<FlatParam> base, std::unique_ptr<FlatParam> adapters, std::vector<model::LoraTarget> targets,
       double lora_scaling, std::unique_ptr<Nf4Base> quantized = nullptr);
  Unit(Unit&&) = default;
  Unit& operator=(Unit&&) = default;

  const std::string& name() const { return base_->layout().unit; }
  FlatParam& base() const { return *base_; }
  FlatParam* adapters() const { return adapters_.get(); }
  Nf4Base* quantized() const { return quantized_.get(); }
  // The FlatParam that trains: the base without LoRA, the adapters with it;
  // null where nothing of the unit trains (a block LoRA does not target).
  FlatParam* trainable() const;

  // The unshard life cycle (above).
  void Unshard(comm::Communicator& shard_group);
  absl::Status Wait(CommWaiter& waiter);
  absl::Status Reshard();
  // Reshards the trainable FlatParam alone; a frozen one stays as it is
  // (its parameters never change, so it can stay gathered for a next use).
  absl::Status ReshardTrainable();
  // An all-gather of the unit is in flight (it counts against
  // [prefetch] max_inflight_all_gathers).
  bool gathering() const;

  // The weights a family computes with, valid while unsharded: the base's
  // (and the quantized matrices', in the unit's order), and for a block its
  // adapters mapped onto the base weights they target.
  const Weights& weights() const { return quantized_ ? merged_ : base_->weights(); }
  BlockWeights block_weights() const;

  // Allocates the gradient storage of both FlatParams (zeroed) where it is
  // not yet (frozen FlatParams have none).
  void EnsureGrads();

  // Training's forward keeps the activation; its backward takes it back
  // (which leaves none).
  void Keep(Activation a) { activation_ = std::move(a); }
  Activation Take() { return std::exchange(activation_, Activation{}); }

 private:
  std::unique_ptr<FlatParam> base_;
  std::unique_ptr<FlatParam> adapters_;
  std::unique_ptr<Nf4Base> quantized_;
  Weights merged_;  // with `quantized`: every weight in the unit's order
  std::vector<model::LoraTarget> targets_;
  double lora_scaling_ = 0;
  Activation activation_;
};

}  // namespace shardline
