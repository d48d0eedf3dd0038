// GradReduction: the gradient reduction of docs/design.md's step. As soon as a
// unit's backward is complete its gradient is reduce-scattered over the
// shard group (cast to the reduce dtype first where that differs; a one-rank
// group's copy casts as it copies), and once
// the shard is all-reduced across replicate groups (hybrid strategies), or
// reduce-scattered across them where the optimizer is sharded across the
// replicas (FlatParam::replica_sharded).
// Units are started in backward order on every rank, and the all-reduces are
// issued in that order everywhere: on a device-ordered backend (NCCL) right
// after the unit's reduce-scatter, on the same stream; on a host backend
// (Gloo) queued right after it too, on the replicate communicator's thread,
// which starts it once the reduce-scatter finished (AllReduceAfter), or,
// where the shard is complete only after the host added a scratch into it,
// at Finish once that reduce-scatter finished, oldest first.
//
// Over several micro-batches (GradAccumulation::kSharded) every micro-batch
// is reduced: the first reduce-scatters into grad_shard, each later one into
// a scratch shard that is then added to it, and only the last micro-batch's
// reduction all-reduces the sum across replicate groups. On a device-ordered
// backend the compute stream waits for such a reduce-scatter, adds, and the
// all-reduce (ordered after the compute stream) follows, all issued in Start.
//
// Memory: the cast copy and the scratch shard live until their
// reduce-scatter finished; a unit's full gradient is freed then too, unless
// the strategy keeps it (ZeRO 0-1).
// Not thread-safe: the engine's step thread drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/comm_waiter.h"
#include "worker/comm/communicator.h"
#include "worker/engine/flat_param.h"

namespace shardline {

class GradReduction {
 public:
  // The communicators, waiter and ledger must outlive this object.
  GradReduction(comm::Communicator* shard, comm::Communicator* replicate, CommWaiter* waiter,
                MemoryLedger* ledger)
      : shard_(shard), replicate_(replicate), waiter_(waiter), ledger_(ledger) {}

  // Starts reducing `unit`'s full gradient into its grad_shard: replacing
  // what grad_shard holds, or with `accumulate` adding to it; `last` (the
  // step's last reduction of this unit) also all-reduces it across replicate
  // groups. An error is a failed device-side wait (device backends only).
  absl::Status Start(FlatParam* unit, bool accumulate, bool last);
  // Advances reductions in order: without `wait_all`, only those already
  // done (no waiting); with it, every one, after which grad_shard of every
  // started unit holds the reduced gradient for the compute stream.
  // `max_in_flight` bounds the reductions left unfinished (the oldest are
  // waited for first): each holds a unit's whole gradient, so this bounds
  // the gradient memory of a backward to that many units plus the one in
  // compute, as FSDP2 keeps one reduce-scatter in flight.
  absl::Status Pump(bool wait_all, size_t max_in_flight = SIZE_MAX);
  // Whether `unit`'s grad_shard holds its reduced gradient already: no
  // reduction of it left to wait for (no waiting here, as Pump without
  // wait_all). What is left is waited for by Pump(wait_all).
  bool Reduced(const FlatParam* unit) const;
  // Where a unit's gradient shard was computed without a reduce-scatter
  // (SparseEmbedding): writes `part` (this rank's shard, reduce dtype) into
  // its grad_shard, or with `replace` false adds it, once any reduction of
  // the unit already started has finished, its all-reduce included (`part`
  // is then reduced across replicas already); `last` then all-reduces it
  // across replicate groups, after every reduction started before it.
  absl::Status AddShard(FlatParam* unit, const at::Tensor& part, bool replace, bool last);

 private:
  struct Pending {
    FlatParam* unit = nullptr;
    std::shared_ptr<comm::Work> reduce_scatter;
    at::Tensor cast;     // reduce-dtype copy of the gradient, alive until the op ends
    at::Tensor scratch;  // accumulate: the reduce-scatter's output, added to grad_shard
    bool last = false;   // all-reduce across replicate groups after the reduce-scatter
    bool scattered = false;
    std::shared_ptr<comm::Work> all_reduce;  // across replicate groups
  };

  // Waits for p's reduce-scatter, folds its result into the shard, frees its
  // buffers and, where it is the last, starts its all-reduce.
  absl::Status Finish(Pending& p);
  // The reduction across replicate groups of `unit`'s shard, run after
  // `after` (null: in issue order): an all-reduce of grad_shard or, where
  // the optimizer is sharded across the replicas, a reduce-scatter of it
  // into grad_owned (FlatParam). Called "all-reduce" below either way.
  std::shared_ptr<comm::Work> AcrossReplicas(FlatParam* unit, std::shared_ptr<comm::Work> after);
  // A reduction started earlier still has its all-reduce to issue (at Finish).
  bool AllReduceAwaited() const;

  comm::Communicator* const shard_;
  comm::Communicator* const replicate_;
  CommWaiter* const waiter_;
  MemoryLedger* const ledger_;
  std::vector<Pending> pending_;
};

}  // namespace shardline
