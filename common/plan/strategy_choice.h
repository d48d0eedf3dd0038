// What `[parallelism] strategy = "auto"` runs (DESIGN.md, "Control plane"):
// the coordinator asks the planner (common/plan/plan.h) for every strategy's
// memory and step time at the attempt's world size, on the smallest memory
// among the attempt's workers and at the bus bandwidth its ranks measured at
// the job's last rendezvous (a default for the device kind before any was
// measured), and takes the fastest one that fits. It picks again at every
// restart, since the world size, the workers and the measurement change.
//
// Only the strategies that need no shard group are candidates (no_shard,
// zero1, shard_grad_op, full_shard); the job's own activation checkpointing
// setting is kept. Where the job file leaves [train] grad_accumulation to
// it, each candidate is weighed in both modes; where it leaves
// [parallelism] sparse_embedding, with the table gathered and sparse (where
// that applies: sharded parameters or a sharded LoRA base). Pure
// arithmetic; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"

namespace shardline {

struct AttemptCluster {
  int world = 1;
  int hosts = 1;                      // distinct hosts among the ranks
  int64_t min_memory_bytes = 0;       // the smallest worker's memory
  std::string device_kind = "cpu";    // "cuda" or "cpu"
  double measured_bus_bandwidth = 0;  // bytes/s per rank; 0: not measured yet
};

struct StrategyChoice {
  Strategy strategy = Strategy::kFullShard;
  // The job's own, or where TrainConfig.auto_grad_accumulation lets it the
  // faster of the two modes that fits (unsharded: less communication, more
  // memory; it matters only with several micro-batches).
  GradAccumulation grad_accumulation = GradAccumulation::kSharded;
  // The job's own, or where ParallelismConfig.auto_sparse_embedding lets it
  // whichever is faster (sparse: a few rows per token moved, more bytes for
  // a tied table whose head still gathers it).
  bool sparse_embedding = false;
  std::string why;  // one line for Job.message and shardctl status
};

absl::StatusOr<StrategyChoice> ChooseStrategy(const JobConfig& config, const AttemptCluster& cluster);

}  // namespace shardline
