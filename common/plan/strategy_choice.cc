#include "common/plan/strategy_choice.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/plan/plan.h"

namespace shardline {
namespace {

bool Candidate(Strategy s) { return !IsHybrid(s); }

}  // namespace

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
  absl::StatusOr<Plan> plan = MakePlan(in);
  if (!plan.ok()) return plan.status();
  const bool ckpt = c.memory.activation_checkpointing;
  const StrategyPlan* best = nullptr;
  const StrategyPlan* smallest = nullptr;
  for (const StrategyPlan& p : plan->strategies) {
    if (!Candidate(p.strategy)) continue;
    const int64_t peak = ckpt ? p.peak_bytes_checkpointed : p.peak_bytes;
    if (!smallest || peak < (ckpt ? smallest->peak_bytes_checkpointed : smallest->peak_bytes)) smallest = &p;
    const bool fits = ckpt ? p.fits_checkpointed : p.fits;
    const double step = ckpt ? p.step_s_checkpointed : p.step_s;
    if (fits && (!best || step < (ckpt ? best->step_s_checkpointed : best->step_s))) best = &p;
  }
  if (!smallest) return absl::InternalError("the planner returned no strategy");
  const std::string bandwidth =
      a.measured_bus_bandwidth > 0 ? absl::StrFormat("%.3g GB/s measured", a.measured_bus_bandwidth / 1e9)
                                   : absl::StrFormat("%.3g GB/s assumed until measured", bw / 1e9);
  StrategyChoice out;
  if (best) {
    out.strategy = best->strategy;
    out.why = absl::StrFormat(
        "auto: %s, the fastest that fits: %.3g s/step predicted, %.3g of %.3g GB per rank, at %d ranks and %s",
        StrategyName(best->strategy), ckpt ? best->step_s_checkpointed : best->step_s,
        (ckpt ? best->peak_bytes_checkpointed : best->peak_bytes) / 1e9, s.device_memory_bytes / 1e9, a.world,
        bandwidth);
  } else {
    out.strategy = smallest->strategy;
    out.why = absl::StrFormat("auto: %s, the least memory, though none is predicted to fit: %.3g of %.3g GB per rank",
                              StrategyName(smallest->strategy),
                              (ckpt ? smallest->peak_bytes_checkpointed : smallest->peak_bytes) / 1e9,
                              s.device_memory_bytes / 1e9);
  }
  return out;
}

}  // namespace shardline
