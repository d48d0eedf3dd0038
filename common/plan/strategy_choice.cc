#include "common/plan/strategy_choice.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/plan/plan.h"

namespace shardline {

absl::StatusOr<StrategyChoice> ChooseStrategy(const JobConfig& c, const AttemptCluster& a) {
  PlanInput in = PlanInputForJob(c, a.world);
  ClusterSpec& s = in.cluster;
  s.gpus_per_node = std::max(1, a.world / std::max(1, a.hosts));
  s.device_memory_bytes = static_cast<double>(std::max<int64_t>(a.min_memory_bytes, 1));
  const bool cuda = a.device_kind == "cuda";
  // Before a measurement: NVLink-class links on GPUs, Gloo over loopback
  // TCP on CPUs; a CPU rank's achieved FLOP/s and memory bandwidth.
  const double bw = a.measured_bus_bandwidth > 0 ? a.measured_bus_bandwidth : cuda ? 150e9 : 2e9;
  s.intra_node_bw = bw;
  s.inter_node_bw = a.measured_bus_bandwidth > 0 ? bw : cuda ? 25e9 : 1e9;
  if (!cuda) {
    s.flops = 5e10;
    s.memory_bw = 10e9;
  }
  const bool ckpt = c.memory.activation_checkpointing;
  std::vector<GradAccumulation> modes = {c.train.grad_accumulation};
  if (c.train.auto_grad_accumulation) modes = {GradAccumulation::kSharded, GradAccumulation::kUnsharded};
  std::vector<bool> tables = {c.parallelism.sparse_embedding};
  if (c.parallelism.auto_sparse_embedding) tables = {false, true};
  struct Candidate {
    StrategyPlan plan;
    GradAccumulation mode;
    bool sparse;
    int64_t peak() const { return plan.peak_bytes; }
  };
  std::vector<Candidate> candidates;
  for (bool sparse : tables) {
    for (GradAccumulation mode : modes) {
      in.grad_accumulation = mode;
      in.sparse_embedding = sparse;
      absl::StatusOr<Plan> plan = MakePlan(in);
      if (!plan.ok()) return plan.status();
      for (StrategyPlan& p : plan->strategies) {
        if (IsHybrid(p.strategy)) continue;  // needs a shard group
        // The mode means nothing where gradients are whole anyway, nor the
        // sparse table where the planner did not apply it.
        if (mode != modes.front() && !ShardsGrads(p.strategy)) continue;
        if (sparse != tables.front() && !p.sparse_embedding) continue;
        if (ckpt) {  // the job's own setting decides which figures count
          p.peak_bytes = p.peak_bytes_checkpointed, p.fits = p.fits_checkpointed, p.step_s = p.step_s_checkpointed;
        }
        candidates.push_back({p, mode, sparse});
      }
    }
  }
  const Candidate* best = nullptr;
  const Candidate* smallest = nullptr;
  for (const Candidate& k : candidates) {
    if (!smallest || k.peak() < smallest->peak()) smallest = &k;
    if (k.plan.fits && (!best || k.plan.step_s < best->plan.step_s)) best = &k;
  }
  if (!smallest) return absl::InternalError("the planner returned no strategy");
  const std::string bandwidth =
      a.measured_bus_bandwidth > 0 ? absl::StrFormat("%.3g GB/s measured", a.measured_bus_bandwidth / 1e9)
                                   : absl::StrFormat("%.3g GB/s assumed until measured", bw / 1e9);
  const Candidate& pick = best ? *best : *smallest;
  StrategyChoice out;
  out.strategy = pick.plan.strategy;
  out.grad_accumulation = pick.mode;
  out.sparse_embedding = pick.sparse;
  std::string mode = c.train.auto_grad_accumulation && ShardsGrads(pick.plan.strategy)
                         ? absl::StrFormat(" with %s gradient accumulation", GradAccumulationName(pick.mode))
                         : "";
  if (c.parallelism.auto_sparse_embedding && pick.sparse) absl::StrAppend(&mode, " and the sparse embedding");
  if (best) {
    out.why = absl::StrFormat(
        "auto: %s%s, the fastest that fits: %.3g s/step predicted, %.3g of %.3g GB per rank, at %d ranks and %s",
        StrategyName(pick.plan.strategy), mode, pick.plan.step_s, pick.peak() / 1e9, s.device_memory_bytes / 1e9,
        a.world, bandwidth);
  } else {
    out.why = absl::StrFormat("auto: %s%s, the least memory, though none is predicted to fit: %.3g of %.3g GB per rank",
                              StrategyName(pick.plan.strategy), mode, pick.peak() / 1e9, s.device_memory_bytes / 1e9);
  }
  return out;
}

}  // namespace shardline
