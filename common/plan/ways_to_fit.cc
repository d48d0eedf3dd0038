#include "common/plan/ways_to_fit.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/plural.h"

namespace shardline {

namespace {

// `in` at `workers` ranks, each keeping `per_rank` sequences a step.
PlanInput AtWorkers(PlanInput in, int workers, int64_t per_rank) {
  in.cluster.workers = workers;
  in.batch_size = static_cast<int>(per_rank * workers);
  return in;
}

bool StrategyFits(const PlanInput& in, Strategy s) {
  absl::StatusOr<Plan> p = MakePlan(in);
  if (!p.ok()) return false;
  for (const StrategyPlan& sp : p->strategies) {
    if (sp.strategy == s) return sp.fits || sp.fits_checkpointed;
  }
  return false;
}

// Doubling to the first world that fits, then the smallest between: memory
// per rank falls as the world grows (no_shard's never does).
int SmallestWorld(const PlanInput& in, Strategy s, int64_t per_rank) {
  int lo = in.cluster.workers, hi = 0;
  for (int w = std::max(2, 2 * lo); w <= WaysToFit::kMaxWorld; w *= 2) {
    if (StrategyFits(AtWorkers(in, w, per_rank), s)) {
      hi = w;
      break;
    }
    lo = w;
  }
  while (hi > 0 && hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (StrategyFits(AtWorkers(in, mid, per_rank), s)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

FitOption Planned(std::string name, std::string flags, const PlanInput& in) {
  FitOption o{std::move(name), std::move(flags), in.cluster.workers};
  absl::StatusOr<Plan> p = MakePlan(in);
  if (!p.ok()) {
    o.unsupported = std::string(p.status().message());
    return o;
  }
  o.strategy = p->recommended;
  o.checkpointing = p->recommended_checkpointing;
  o.peak_bytes = std::numeric_limits<int64_t>::max();
  for (const StrategyPlan& sp : p->strategies) {
    if (!o.strategy.empty() && StrategyName(sp.strategy) == o.strategy) {
      o.peak_bytes = o.checkpointing ? sp.peak_bytes_checkpointed : sp.peak_bytes;
      break;
    }
    if (o.strategy.empty()) o.peak_bytes = std::min(o.peak_bytes, sp.peak_bytes_checkpointed);
  }
  return o;
}

LoraConfig Rank16EveryProjection() {
  LoraConfig l;
  l.enabled = true;
  l.rank = 16;
  l.alpha = 32;
  l.target_modules = {"all-linear"};
  return l;
}

std::vector<FitOption> Options(const PlanInput& in, int64_t per_rank) {
  std::vector<FitOption> out;
  const std::string lora_flags = in.lora.enabled ? "" : "--lora-rank 16 --lora-targets all-linear";
  if (!in.lora.enabled) {
    if (in.master_dtype != DType::kBFloat16) {
      PlanInput b = in;
      b.param_dtype = b.reduce_dtype = b.master_dtype = DType::kBFloat16;
      b.moments_dtype = MomentsDType::kBFloat16;
      out.push_back(Planned("bf16 state (8 bytes a parameter)", "--dtype bf16 --reduce-dtype bf16 --optimizer-state bf16", b));
    }
    if (in.moments_dtype != MomentsDType::kDynamic8Bit) {
      PlanInput e = in;
      e.master_dtype = DType::kFloat32;
      e.moments_dtype = MomentsDType::kDynamic8Bit;
      out.push_back(Planned("8-bit moments", "--optimizer-state 8bit", e));
    }
    PlanInput l = in;
    l.lora = Rank16EveryProjection();
    out.push_back(Planned("LoRA r16", lora_flags, l));
  }
  if (in.lora.base_dtype != LoraBaseDType::kNf4) {
    PlanInput q = in;
    if (!q.lora.enabled) q.lora = Rank16EveryProjection();
    q.lora.base_dtype = LoraBaseDType::kNf4;
    const std::string flags = absl::StrCat(lora_flags, lora_flags.empty() ? "" : " ", "--lora-base-dtype nf4");
    out.push_back(Planned("QLoRA (NF4 base), one worker", flags + " --workers 1", AtWorkers(q, 1, per_rank)));
    if (in.cluster.workers > 1) out.push_back(Planned("QLoRA (NF4 base)", flags, q));
  }
  FitOption offload{"CPU offload", "[memory] cpu_offload = true", in.cluster.workers};
  offload.unsupported = "not supported yet";
  out.push_back(std::move(offload));
  return out;
}

}  // namespace

WaysToFit FindWaysToFit(const PlanInput& in) {
  WaysToFit out;
  absl::StatusOr<Plan> here = MakePlan(in);
  if (!here.ok()) return out;
  const int64_t per_rank = here->micro_batches * static_cast<int64_t>(std::max(1, in.micro_batch_size));
  for (const StrategyPlan& sp : here->strategies) {
    out.smallest_world.push_back({sp.strategy, SmallestWorld(in, sp.strategy, per_rank)});
  }
  out.options = Options(in, per_rank);
  return out;
}

std::string WaysToFitTable(const WaysToFit& w, const PlanInput& in) {
  std::vector<std::string> parts;
  for (const auto& [strategy, world] : w.smallest_world) {
    parts.push_back(world > 0 ? absl::StrCat(StrategyName(strategy), " at ", world)
                              : absl::StrCat(StrategyName(strategy), " at none up to ", WaysToFit::kMaxWorld));
  }
  std::string out = absl::StrCat("on ", Plural(in.cluster.workers, "worker"), " of ",
                                 absl::StrFormat("%.3g", in.cluster.device_memory_bytes),
                                 " bytes; the fewest workers that fit (each with this rank's micro-batches): ",
                                 absl::StrJoin(parts, ", "), "\n");
  if (w.options.empty()) return out;
  const double gib = 1024.0 * 1024 * 1024;
  absl::StrAppend(&out, "\nother ways to fit (peak per rank in GiB: the fastest strategy that fits, else the "
                        "smallest peak):\n");
  absl::StrAppendFormat(&out, "%-34s %7s %-28s %9s  %s\n", "option", "workers", "strategy", "peak", "flags");
  for (const FitOption& o : w.options) {
    if (!o.unsupported.empty()) {
      absl::StrAppendFormat(&out, "%-34s %7d %-28s %9s  %s\n", o.name, o.workers, o.unsupported, "-", o.flags);
      continue;
    }
    const std::string strategy =
        o.strategy.empty() ? "none fits" : absl::StrCat(o.strategy, o.checkpointing ? " with ckpt" : "");
    absl::StrAppendFormat(&out, "%-34s %7d %-28s %9.2f  %s\n", o.name, o.workers, strategy, o.peak_bytes / gib, o.flags);
  }
  return out;
}

std::string WaysToFitJson(const WaysToFit& w) {
  nlohmann::ordered_json at = nlohmann::ordered_json::object();
  for (const auto& [strategy, world] : w.smallest_world) {
    at[StrategyName(strategy)] = world > 0 ? nlohmann::ordered_json(world) : nlohmann::ordered_json();
  }
  nlohmann::ordered_json options = nlohmann::ordered_json::array();
  for (const FitOption& o : w.options) {
    nlohmann::ordered_json j = {{"option", o.name}, {"flags", o.flags}, {"workers", o.workers}};
    if (!o.unsupported.empty()) {
      j["unsupported"] = o.unsupported;
    } else {
      j["strategy"] = o.strategy.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(o.strategy);
      j["checkpointing"] = o.checkpointing;
      j["peak_bytes"] = o.peak_bytes;
    }
    options.push_back(std::move(j));
  }
  return nlohmann::ordered_json{{"fits_at_workers", at}, {"ways_to_fit", options}}.dump();
}

}  // namespace shardline
