#include "common/plan/strategy_choice.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"

namespace shardline {

namespace {

struct Candidate {
  StrategyPlan plan;
  GradAccumulation mode;
  bool sparse;
  int shard_group;  // a hybrid's; else 0
  int64_t peak() const { return plan.peak_bytes; }
};

// The planner's cluster for the attempt. Before a measurement: NVLink-class
// links on GPUs, Gloo over loopback TCP on CPUs, and a CPU rank's achieved
// FLOP/s and memory bandwidth.
ClusterSpec ClusterOf(const AttemptCluster& a) {
  ClusterSpec s;
  s.workers = a.world;
  s.gpus_per_node = std::max(1, a.world / std::max(1, a.hosts));
  s.device_memory_bytes = static_cast<double>(std::max<int64_t>(a.min_memory_bytes, 1));
  const bool cuda = a.device_kind == "cuda";
  s.device = cuda ? DeviceKind::kCuda : DeviceKind::kCpu;
  const bool measured = a.measured_bus_bandwidth > 0;
  // The world ring measures the slowest hop: between hosts where it spans
  // several, which leaves a host's own links to the default.
  s.intra_node_bw = measured && a.hosts <= 1 ? a.measured_bus_bandwidth : cuda ? 150e9 : 2e9;
  s.inter_node_bw = measured ? a.measured_bus_bandwidth : cuda ? 25e9 : 1e9;
  if (!cuda) {
    s.flops = 5e10;
    s.memory_bw = 10e9;
  }
  if (a.measured_flops > 0) s.flops = a.measured_flops;
  s.comm_cpu_s_per_byte = a.measured_comm_cpu_s_per_byte;
  return s;
}

// A hybrid's shard group: a host's ranks, where several hosts hold as many
// each and more than one (at one rank a host a hybrid is no_shard; on one
// host it is full_shard); else 0.
int HostShardGroup(const AttemptCluster& a) {
  const int g = a.ranks_per_host;
  return a.hosts > 1 && g > 1 && g * a.hosts == a.world ? g : 0;
}

// The candidates of one (mode, table): the non-hybrid strategies on the
// attempt's cluster, and where a host's ranks make a shard group the
// hybrids, whose replicate groups share a host's link (strategy_choice.h).
absl::Status AddCandidates(PlanInput in, const JobConfig& c, const AttemptCluster& a, bool first_mode,
                           bool first_table, std::vector<Candidate>* out) {
  const int g = HostShardGroup(a);
  for (const bool hybrid : {false, true}) {
    if (hybrid && g == 0) break;
    in.shard_group_size = hybrid ? g : 0;
    if (hybrid) in.cluster.inter_node_bw /= g;
    SL_ASSIGN_OR_RETURN(Plan plan, MakePlan(in));
    for (StrategyPlan& p : plan.strategies) {
      if (IsHybrid(p.strategy) != hybrid) continue;
      // The mode means nothing where gradients are whole anyway, nor the
      // sparse table where the planner did not apply it.
      if (!first_mode && !ShardsGrads(p.strategy)) continue;
      if (!first_table && !p.sparse_embedding) continue;
      if (c.memory.activation_checkpointing) {  // the job's own setting decides which figures count
        p.peak_bytes = p.peak_bytes_checkpointed, p.fits = p.fits_checkpointed, p.step_s = p.step_s_checkpointed;
      }
      out->push_back({p, in.grad_accumulation, in.sparse_embedding, hybrid ? g : 0});
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StrategyChoice> ChooseStrategy(const JobConfig& c, const AttemptCluster& a) {
  return ChooseStrategyOn(c, a, ClusterOf(a));
}

absl::StatusOr<StrategyChoice> ChooseStrategyOn(const JobConfig& c, const AttemptCluster& a,
                                                const ClusterSpec& figures) {
  PlanInput in = PlanInputForJob(c, a.world);
  in.cluster = figures;
  std::vector<GradAccumulation> modes = {c.train.grad_accumulation};
  if (c.train.auto_grad_accumulation) modes = {GradAccumulation::kSharded, GradAccumulation::kUnsharded};
  std::vector<bool> tables = {c.parallelism.sparse_embedding};
  if (c.parallelism.auto_sparse_embedding) tables = {false, true};
  std::vector<Candidate> candidates;
  for (bool sparse : tables) {
    for (GradAccumulation mode : modes) {
      in.grad_accumulation = mode;
      in.sparse_embedding = sparse;
      SL_RETURN_IF_ERROR(AddCandidates(in, c, a, mode == modes.front(), sparse == tables.front(), &candidates));
    }
  }
  const Candidate* best = nullptr;
  const Candidate* smallest = nullptr;
  for (const Candidate& k : candidates) {
    if (!smallest || k.peak() < smallest->peak()) smallest = &k;
    if (k.plan.fits && (!best || k.plan.step_s < best->plan.step_s)) best = &k;
  }
  if (!smallest) return absl::InternalError("the planner returned no strategy");
  std::string bandwidth =
      a.measured_bus_bandwidth > 0
          ? absl::StrFormat("%.3g GB/s measured", a.measured_bus_bandwidth / 1e9)
          : absl::StrFormat("%.3g GB/s assumed until measured",
                            (a.hosts > 1 ? in.cluster.inter_node_bw : in.cluster.intra_node_bw) / 1e9);
  if (a.measured_flops > 0) {
    absl::StrAppendFormat(&bandwidth, ", %.3g GFLOP/s a rank and %.3g ns of its compute a byte sent measured",
                          a.measured_flops / 1e9, a.measured_comm_cpu_s_per_byte * 1e9);
  }
  const Candidate& pick = best ? *best : *smallest;
  StrategyChoice out;
  out.strategy = pick.plan.strategy;
  out.shard_group_size = pick.shard_group;
  out.grad_accumulation = pick.mode;
  out.sparse_embedding = pick.sparse;
  out.step_s = pick.plan.step_s;
  std::string what = StrategyName(pick.plan.strategy);
  if (pick.shard_group > 0) absl::StrAppendFormat(&what, " (shard groups of %d, one a host)", pick.shard_group);
  if (c.train.auto_grad_accumulation && ShardsGrads(pick.plan.strategy)) {
    absl::StrAppendFormat(&what, " with %s gradient accumulation", GradAccumulationName(pick.mode));
  }
  if (c.parallelism.auto_sparse_embedding && pick.sparse) absl::StrAppend(&what, " and the sparse embedding");
  const double memory = in.cluster.device_memory_bytes;
  if (best) {
    out.why = absl::StrFormat(
        "auto: %s, the fastest that fits: %.3g s/step predicted, %.3g of %.3g GB per rank, at %d ranks and %s", what,
        pick.plan.step_s, pick.peak() / 1e9, memory / 1e9, a.world, bandwidth);
  } else {
    out.why = absl::StrFormat("auto: %s, the least memory, though none is predicted to fit: %.3g of %.3g GB per rank",
                              what, pick.peak() / 1e9, memory / 1e9);
  }
  return out;
}

}  // namespace shardline
