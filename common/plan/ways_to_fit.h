// WaysToFit: where no strategy fits a job on its workers, what would.
//
// Two answers, each planned by MakePlan on the job's own cluster:
//  - the fewest workers at which each strategy fits (activation
//    checkpointing allowed), each rank keeping its micro-batches, so that
//    the world is the one thing that changes;
//  - the ways people fit a model their precision cannot hold, side by side:
//    optimizer state in bf16 (torch.optim.AdamW on a bf16 model: bf16
//    weights, gradients and moments, no master) or with 8-bit moments,
//    LoRA (rank 16 on every projection), QLoRA (the same over an NF4 base)
//    on one worker and on these, and CPU offload (not supported yet: its
//    row says so instead of a number).
// Each option is what its flags would plan; none is applied to the job.
//
// Pure arithmetic, as plan.h. Thread-compatible.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/job/job_config.h"
#include "common/plan/plan.h"

namespace shardline {

struct FitOption {
  std::string name;   // "bf16 state", "QLoRA r16, one worker", ...
  std::string flags;  // the `shardctl plan` flags that plan it
  int workers = 0;
  // The fastest strategy that fits (empty: none does), whether it needs
  // activation checkpointing, and its peak per rank; where none fits, the
  // smallest peak of any strategy (checkpointed).
  std::string strategy;
  bool checkpointing = false;
  int64_t peak_bytes = 0;
  std::string unsupported;  // why the option cannot be planned; empty if it was
};

struct WaysToFit {
  static constexpr int kMaxWorld = 65536;
  std::vector<std::pair<Strategy, int>> smallest_world;  // 0: none up to kMaxWorld
  std::vector<FitOption> options;
};

// `in` is a plan input MakePlan accepts.
WaysToFit FindWaysToFit(const PlanInput& in);

// For people (a line and a table) and for programs (`fits_at_workers`,
// `ways_to_fit` beside PlanJson's keys).
std::string WaysToFitTable(const WaysToFit& w, const PlanInput& in);
std::string WaysToFitJson(const WaysToFit& w);

}  // namespace shardline
