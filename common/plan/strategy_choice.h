// What `[parallelism] strategy = "auto"` runs (docs/design.md, "Control plane"):
// the coordinator asks the planner (common/plan/plan.h) for every strategy's
// memory and step time at the attempt's world size, on the smallest memory
// among the attempt's workers and at the bus bandwidth its ranks measured at
// the job's last rendezvous (a default for the device kind before any was
// measured), and takes the fastest one that fits. It picks again at every
// restart, since the world size, the workers and the measurement change.
//
// Candidates: no_shard, zero1, shard_grad_op and full_shard, and where the
// ranks span hosts that each hold the same number of them (more than one)
// the two hybrids with a host's ranks as the shard group (the coordinator
// numbers a host's ranks consecutively; a job's shard_group_size is not
// read under auto). The job's own activation checkpointing setting is kept.
//
// On host transports the ranks also measure their compute and what the
// transport's CPU takes from it (worker/run/rendezvous_figures.h): where ranks
// share a host's cores, a byte sent stretches the step as much as a few
// thousand FLOPs, which decides between strategies that move different bytes
// over the same compute (LoRA's replicated base against a sharded one).
//
// The measured figure is the world ring's bus bandwidth: across hosts, what
// one flow gets out of a host. A hybrid's replicate groups hold one rank of
// each host and run at once, so a host's link carries ranks-per-host of
// their flows: each gets 1/ranks-per-host of it. Inside a host, where
// nothing was measured apart, the device kind's default. Where the job file leaves [train] grad_accumulation to
// it, each candidate is weighed in both modes; where it leaves
// [parallelism] sparse_embedding, with the table gathered and sparse (where
// that applies: sharded parameters or a sharded LoRA base). Pure
// arithmetic; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "common/plan/plan.h"

namespace shardline {

struct AttemptCluster {
  int world = 1;
  int hosts = 1;                      // distinct hosts among the ranks
  int ranks_per_host = 0;             // where every host holds as many; else 0
  int64_t min_memory_bytes = 0;       // the smallest worker's memory
  std::string device_kind = "cpu";    // "cuda" or "cpu"
  double measured_bus_bandwidth = 0;  // bytes/s per rank; 0: not measured yet
  // Host transports (0: not measured; the device kind's defaults): the
  // slowest rank's compute (FLOP/s), and the seconds of it each byte a rank
  // sends costs (ClusterSpec::comm_cpu_s_per_byte).
  double measured_flops = 0;
  double measured_comm_cpu_s_per_byte = 0;
};

struct StrategyChoice {
  Strategy strategy = Strategy::kFullShard;
  int shard_group_size = 0;  // a hybrid's: a host's ranks; else 0
  // The job's own, or where TrainConfig.auto_grad_accumulation lets it the
  // faster of the two modes that fits (unsharded: less communication, more
  // memory; it matters only with several micro-batches).
  GradAccumulation grad_accumulation = GradAccumulation::kSharded;
  // The job's own, or where ParallelismConfig.auto_sparse_embedding lets it
  // whichever is faster (sparse: a few rows per token moved, more bytes for
  // a tied table whose head still gathers it).
  bool sparse_embedding = false;
  double step_s = 0;  // the planner's step time for the pick
  std::string why;  // one line for Job.message and shardctl status
};

absl::StatusOr<StrategyChoice> ChooseStrategy(const JobConfig& config, const AttemptCluster& cluster);

// The same on the given figures in place of the device kind's and the
// measurement's (`shardctl plan` of a job that says "auto"): `figures` is
// the cluster a non-hybrid runs on, its inter_node_bw the world ring's.
absl::StatusOr<StrategyChoice> ChooseStrategyOn(const JobConfig& config, const AttemptCluster& cluster,
                                                const ClusterSpec& figures);

}  // namespace shardline
