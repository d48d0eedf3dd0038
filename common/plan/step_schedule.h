// StepSchedule: one training step of one rank, unit by unit, in the order the
// engine issues its work (worker/engine/engine.cc), on two links modelled as
// queues: the shard group's and the replicas'. It is what `shardctl plan`
// predicts a step's time with.
//
// Why a schedule and not max(compute, communication): a collective hides only
// behind the compute that runs while it is in flight, and the engine bounds
// that window. Forward keeps at most `max_inflight_gathers` gathers ahead;
// the head (its loss fused with its backward) issues as many of backward's
// first gathers; backward prefetches one block ahead; sharded accumulation
// keeps one reduce-scatter in flight (the one after it waits); the first
// block's gather hides behind the last step's update only; a large head's
// gather behind two blocks' compute, the sparse embedding's waited-on
// exchanges and the last reductions hide behind nothing. On the
// emulated hosts the aggregate model was 23-43% short wherever compute and
// communication were of one size (bench/results/network_compare_*.md).
//
// Each link sends one collective at a time, in the order they were issued, at
// its bandwidth (a ring's bytes per rank / bus bandwidth). Compute runs at the
// figures the caller gives. Pure arithmetic; thread-compatible.
#pragma once

#include <vector>

namespace shardline {

struct UnitWork {
  double forward_s = 0, backward_s = 0;  // compute, per micro-batch
  double gather_bytes = 0;               // all-gathered before forward; 0 = held whole
  bool gather_in_backward = false;       // resharded after forward, gathered again for backward (not the last block)
  bool has_backward = true;              // (a frozen embedding's is skipped)
  double reduce_bytes = 0;               // reduce-scattered after its backward
  double replica_bytes = 0;              // all-reduced across replicas in the last micro-batch
  // The optimizer sharded across the replicas: replica_bytes are then a
  // reduce-scatter, and the updated pieces are all-gathered across the
  // replicas during the last step's update, in unit order (the first
  // block first where its gather is carried); the unit's first gather of
  // the step goes out on the shard link only once its pieces are in.
  double replica_gather_bytes = 0;
  double lookup_bytes = 0;               // sparse embedding: exchanged and waited on before forward
  double replica_lookup_bytes = 0;       // likewise across replicas, first (the head over the world)
  double first_lookup_bytes = 0;         // likewise, in the first micro-batch only (once per step)
  // The head over the vocabulary (VocabParallelHead): every rank's hidden
  // states go out first, in flight while `overlapped_lookup_s` of the unit's
  // forward (its own tokens' statistics) computes, then are waited on
  // before lookup_bytes (the statistics' exchange).
  double overlapped_lookup_bytes = 0;
  double overlapped_lookup_s = 0;
  double row_grad_bytes = 0;             // sparse embedding: exchanged and waited on in backward
  // Sparse embedding: the rows' gradients gathered across replicas and
  // waited on, after row_grad_bytes: every micro-batch, or the last only.
  double replica_row_grad_bytes = 0;
  bool replica_rows_last_only = false;
};

struct ScheduleInput {
  std::vector<UnitWork> units;  // in forward order
  int micro_batches = 1;
  // Sharded accumulation: every micro-batch reduce-scatters, one in flight.
  // Otherwise only the last micro-batch's backward reduces, none waited on.
  bool reduce_every_micro = true;
  int max_inflight_gathers = 2;
  double shard_bw = 1, replica_bw = 1;  // bytes/s per rank
  double after_step_gather_bytes = 0;   // parameters gathered after the optimizer, waited on
  // The first block's gather (units[1]) was issued this long before the
  // step began, during the last step's update (Engine::StepOptions); 0 = at
  // the step's start, as in a job's first step.
  double carried_gather_s = 0;
  // The first block stays gathered from a backward to the next forward
  // (Engine::ReshardAfterBackward): wholly between micro-batches, and this
  // much of it, a frozen base's gather, from the last step.
  double first_block_frozen_bytes = 0;
  // Compute seconds each byte sent costs the rank (ClusterSpec's): every
  // unit's compute stretches by the step's share of it.
  double cpu_s_per_byte = 0;
};

struct ScheduleTimes {
  double step_s = 0;     // to the last collective's end (the optimizer excluded)
  double compute_s = 0;  // the units' compute
  double comm_s = 0;     // seconds the links sent
  double bytes = 0;      // sent per rank per step
};

ScheduleTimes SimulateStep(const ScheduleInput& in);

}  // namespace shardline
