// A Plan as shardctl prints it: a table for people, JSON for programs.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/json_object.h"
#include "common/plan/plan.h"

namespace shardline {

std::string PlanTable(const Plan& p) {
  const double gib = 1024.0 * 1024 * 1024;
  std::string out = absl::StrFormat(
      "model: %.3g parameters (%.3g trained), %.3g training FLOPs per token, %d tokens per step (%d micro-batches "
      "per rank)\n\n",
      static_cast<double>(p.params), static_cast<double>(p.trainable_params), p.flops_per_token, p.tokens_per_step,
      p.micro_batches);
  absl::StrAppend(&out, "memory per rank and comm (sent per rank per step) in GiB, 2^30 bytes; times in seconds; "
                       "grp: the shard group; reserve: what the allocator and process hold beyond the live tensors "
                       "(fits counts it)\n");
  absl::StrAppendFormat(&out, "%-19s %3s %9s %9s %9s %9s %9s %9s %9s %9s %9s %8s %8s %8s %8s %9s %s\n", "strategy",
                        "grp", "state", "params", "grads", "master", "optim", "transnt", "acts", "acts_ckpt",
                        "reserve", "comm", "comp_s", "exp_cm_s", "step_s", "step_ckpt", "fits");
  for (const auto& s : p.strategies) {
    absl::StrAppendFormat(
        &out, "%-19s %3d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f %8.3f %8.3f %8.3f %9.3f %s\n",
        StrategyName(s.strategy), s.shard_group, s.state_bytes / gib, s.params_bytes / gib, s.grads_bytes / gib,
        s.master_bytes / gib, s.optimizer_bytes / gib, s.transient_bytes / gib, s.activation_bytes / gib,
        s.activation_bytes_checkpointed / gib, s.reserve_bytes / gib, s.comm_bytes / gib, s.compute_s,
        s.exposed_comm_s, s.step_s, s.step_s_checkpointed, s.fits ? "yes" : (s.fits_checkpointed ? "with ckpt" : "no"));
  }
  if (p.recommended.empty()) {
    absl::StrAppend(&out, "\nrecommended: none fits\n");
  } else {
    absl::StrAppend(&out, "\nrecommended: ", p.recommended,
                    p.recommended_checkpointing ? " with activation checkpointing" : "", "\n");
  }
  return out;
}

std::string PlanJson(const Plan& p) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& s : p.strategies) {
    rows.push_back({{"strategy", StrategyName(s.strategy)},
                    {"shard_group", s.shard_group},
                    {"state_bytes", s.state_bytes},
                    {"params_bytes", s.params_bytes},
                    {"grads_bytes", s.grads_bytes},
                    {"master_bytes", s.master_bytes},
                    {"optimizer_bytes", s.optimizer_bytes},
                    {"transient_bytes", s.transient_bytes},
                    {"activation_bytes", s.activation_bytes},
                    {"activation_bytes_checkpointed", s.activation_bytes_checkpointed},
                    {"peak_bytes", s.peak_bytes},
                    {"peak_bytes_checkpointed", s.peak_bytes_checkpointed},
                    {"reserve_bytes", s.reserve_bytes},
                    {"reserve_bytes_checkpointed", s.reserve_bytes_checkpointed},
                    {"fits", s.fits},
                    {"fits_checkpointed", s.fits_checkpointed},
                    {"comm_bytes", s.comm_bytes},
                    {"compute_s", FiniteOrNull(s.compute_s)},
                    {"comm_s", FiniteOrNull(s.comm_s)},
                    {"exposed_comm_s", FiniteOrNull(s.exposed_comm_s)},
                    {"optimizer_s", FiniteOrNull(s.optimizer_s)},
                    {"step_s", FiniteOrNull(s.step_s)},
                    {"step_s_checkpointed", FiniteOrNull(s.step_s_checkpointed)},
                    {"tokens_per_second", FiniteOrNull(s.tokens_per_second)}});
  }
  return nlohmann::ordered_json{{"params", p.params},
                                {"trainable_params", p.trainable_params},
                                {"flops_per_token", FiniteOrNull(p.flops_per_token)},
                                {"tokens_per_step", p.tokens_per_step},
                                {"micro_batches", p.micro_batches},
                                {"strategies", rows},
                                {"recommended", p.recommended.empty() ? nlohmann::ordered_json(nullptr)
                                                                      : nlohmann::ordered_json(p.recommended)},
                                {"recommended_checkpointing", p.recommended_checkpointing}}
      .dump();
}

}  // namespace shardline
