// Nf4Base: the projection matrices of one frozen block stored in NF4
// (QLoRA's base, [lora] base_dtype = "nf4"): sharded by blocks of 64 over the
// shard group, all-gathered in 4 bits with their scales, and dequantized into
// the param dtype for each use. The block's other parameters (norms, biases)
// stay in a frozen FlatParam beside it, as bitsandbytes' Linear4bit leaves
// everything but the linear layers' weights.
//
// The unit's NF4 image is common/model/nf4_layout.h's: each matrix
// quantized whole (QuantizeNf4, bitsandbytes' quantize_4bit: its offset is
// the mean of the whole matrix's block maxima, so every rank reads each
// matrix whole at load and keeps its own blocks of it); rank r owns P
// consecutive blocks of the unit's, codes then absmax; shard boundaries are
// block boundaries, so a rank's bytes are its blocks alone. The scales of
// the second quantization and the offsets are every rank's.
//
//   piece      uint8 [P * 33]              this rank's blocks (G = 1: all)
//   gathered   uint8 [G * P * 33]          every rank's, between Unshard and
//                                          WaitForUnshard (G > 1)
//   unsharded  param dtype [sum of numels] the dequantized matrices, which
//                                          `weights` view
//
// Life cycle, in FlatParam's states (flat_param.h): Unshard allocates
// `gathered` and starts its all-gather (with G = 1 there is nothing to
// gather); WaitForUnshard makes the compute stream wait for it, dequantizes
// every matrix into `unsharded` on the compute stream and frees `gathered`;
// Reshard frees `unsharded`, whatever the strategy: the dequantized
// matrices are never kept beyond a use. Repeats are no-ops; a wait without an
// Unshard and a Reshard while gathering are errors, as FlatParam's. The
// weights keep their storage objects (storage_views.h), so a graph that
// saved them reads the values again once they are dequantized again.
//
// Memory lives on the rank's Device, counted in the MemoryLedger as kParams
// (the transient buffers of one matrix's dequantization are not counted).
// Not thread-safe: owned and driven by the engine's step thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "common/model/nf4_layout.h"
#include "common/model/shard_layout.h"
#include "worker/comm/comm_waiter.h"
#include "worker/comm/communicator.h"
#include "worker/device/device.h"
#include "worker/engine/flat_param.h"
#include "worker/engine/nf4.h"

namespace shardline {

class Nf4Base {
 public:
  // One matrix of the unit: its spec and its index among the unit's
  // parameters (model::UnitParams order).
  struct Matrix {
    ParamSpec spec;
    int unit_index = 0;
  };
  // From `quantized[i]` (matrix i quantized whole, QuantizeNf4, on the
  // host: the caller quantizes one matrix at a time, so no block is held
  // whole in fp32), keeps `shard_rank`'s blocks of `group_size` on `device`,
  // which must outlive this, as must `ledger`.
  Nf4Base(std::string unit, std::vector<Matrix> matrices, const std::vector<Nf4Tensor>& quantized, int group_size,
          int shard_rank, at::ScalarType param_dtype, const Device& device, MemoryLedger* ledger);
  ~Nf4Base();
  Nf4Base(const Nf4Base&) = delete;
  Nf4Base& operator=(const Nf4Base&) = delete;

  const std::string& unit() const { return unit_; }
  const std::vector<Matrix>& matrices() const { return matrices_; }
  // The views the model computes with, one a matrix (valid while unsharded).
  const std::vector<at::Tensor>& weights() const { return weights_; }
  const Nf4Layout& layout() const { return layout_; }

  // The life cycle (above).
  void Unshard(comm::Communicator& shard_group);
  absl::Status WaitForUnshard(CommWaiter& waiter);
  absl::Status Reshard();
  UnshardState state() const { return state_; }

 private:
  void Dequantize(const at::Tensor& image);  // image: uint8 [G * P * 33], or the piece with G = 1
  void FreeUnsharded();

  const std::string unit_;
  const std::vector<Matrix> matrices_;
  const Nf4Layout layout_;
  const Device& device_;
  MemoryLedger* const ledger_;
  const Nf4Tables tables_;
  std::vector<float> offsets_;  // a matrix's
  at::Tensor piece_, absmax2_, gathered_, unsharded_;
  std::vector<at::Tensor> weights_;
  UnshardState state_ = UnshardState::kSharded;
  std::shared_ptr<comm::Work> gather_;  // while kGathering with G > 1
};

}  // namespace shardline
