#include "client/render.h"

#include "common/base/json_object.h"
#include "common/base/quoted.h"
#include "common/job/job_config.h"
#include "common/state/job_state.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardline::ctl {

std::string Dump(const Json& j) {
  // ensure_ascii: every character past ASCII and every control as \uXXXX,
  // so the text is exact for a program and inert on a terminal; bytes that
  // are not UTF-8 are replaced rather than thrown on.
  return j.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
}

namespace {


Json RankObject(const v1::RankStatus& r) {
  return {{"rank", r.rank()},
          {"worker_id", r.worker_id()},
          {"host", r.host()},
          {"step", r.step()},
          {"last_collective_seq", r.last_collective_seq()},
          {"lag_steps", r.lag_steps()},
          {"lag_collectives", r.lag_collectives()},
          {"heartbeat_age_seconds", FiniteOrNull(r.heartbeat_age_seconds())},
          {"seconds_since_progress", FiniteOrNull(r.seconds_since_progress())},
          {"stalled", r.stalled()}};
}

Json StepRecordObject(const v1::StepRecord& s) {
  return {{"step", s.step()},
          {"loss", FiniteOrNull(s.loss())},
          {"lr", FiniteOrNull(s.lr())},
          {"grad_norm", FiniteOrNull(s.grad_norm())},
          {"tokens_per_second", FiniteOrNull(s.tokens_per_second())},
          {"val_loss", s.has_val_loss() ? FiniteOrNull(s.val_loss()) : Json(nullptr)},
          {"unix_ms", s.unix_ms()}};
}

Json AttemptObject(const v1::Attempt& a) {
  return {{"world_size", a.world_size()},     {"strategy", a.strategy()},
          {"first_step", a.first_step()},     {"last_step", a.last_step()},
          {"end", a.end()},                   {"started_unix_ms", a.started_unix_ms()},
          {"ended_unix_ms", a.ended_unix_ms()}, {"lost_seconds", FiniteOrNull(a.lost_seconds())}};
}

}  // namespace

Json JobObject(const v1::Job& j) {
  Json out = {{"id", j.id()},
              {"name", j.name()},
              {"state", JobStateName(j.state())},
              {"step", j.step()},
              {"steps", j.steps()},
              {"loss", FiniteOrNull(j.loss())},
              {"tokens_per_second", FiniteOrNull(j.tokens_per_second())},
              {"lr", FiniteOrNull(j.lr())},
              {"grad_norm", FiniteOrNull(j.grad_norm())},
              {"val_loss", j.has_val_loss() ? FiniteOrNull(j.val_loss()) : Json(nullptr)},
              {"val_step", j.val_step()},
              {"workers", j.workers()},
              {"strategy", j.strategy()},
              {"message", j.message()},
              {"worker_ids", std::vector<std::string>(j.worker_ids().begin(), j.worker_ids().end())},
              {"created_unix_ms", j.created_unix_ms()},
              {"stalled", j.stalled()},
              {"straggler", j.straggler()},
              {"ranks", Json::array()},
              {"requested_workers", j.requested_workers()},
              {"restarts", j.restarts()},
              {"strategy_reason", j.strategy_reason()},
              {"measured_bus_bandwidth", FiniteOrNull(j.measured_bus_bandwidth())},
              {"measured_compute_flops", FiniteOrNull(j.measured_compute_flops())},
              {"measured_comm_cpu_s_per_byte", FiniteOrNull(j.measured_comm_cpu_s_per_byte())},
              {"goodput", FiniteOrNull(JobGoodput(j, absl::ToUnixMillis(absl::Now())))},
              {"epoch", FiniteOrNull(EpochAt(j.step(), j.batch_size(), j.sequences_per_epoch()))},
              {"sequences_per_epoch", j.sequences_per_epoch()},
              {"resumed_from", j.resume_from().empty() && j.resumed_from_job().empty()
                                   ? Json(nullptr)
                                   : Json{{"job", j.resumed_from_job()}, {"step", j.resumed_from_step()},
                                          {"path", j.resume_from()}}},
              {"attempts", Json::array()}};
  for (const auto& r : j.ranks()) out["ranks"].push_back(RankObject(r));
  for (const auto& a : j.attempts()) out["attempts"].push_back(AttemptObject(a));
  if (j.history_size()) {
    out["history"] = Json::array();
    for (const auto& s : j.history()) out["history"].push_back(StepRecordObject(s));
  }
  return out;
}

Json WorkerObject(const v1::WorkerInfo& w) {
  return {{"id", w.worker_id()},
          {"host", w.host()},
          {"device", w.device()},
          {"state", WorkerStateName(w.state())},
          {"job_id", w.job_id()},
          {"rank", w.rank()},
          {"memory_bytes", w.memory_bytes()},
          {"heartbeat_age_seconds", FiniteOrNull(w.heartbeat_age_seconds())},
          {"metrics_port", w.metrics_port()},
          {"collective_address", w.collective_address()}};
}

bool HasReportedStep(const v1::Job& j) { return j.step() > 0 && j.tokens_per_second() > 0; }

std::string JobsTable(const std::vector<v1::Job>& jobs) {
  // Each column as wide as its widest cell (a long name, a step count of a
  // million steps), the message last and unpadded.
  std::vector<std::vector<std::string>> rows = {{"ID", "NAME", "STATE", "STEP", "LOSS", "WORKERS", "FROM", "MESSAGE"}};
  for (const auto& j : jobs) {
    rows.push_back({Printable(j.id()), Printable(j.name()), JobStateName(j.state()),
                    absl::StrCat(j.step(), "/", j.steps()), HasReportedStep(j) ? absl::StrFormat("%.4f", j.loss()) : "-",
                    absl::StrCat(j.workers()), j.resumed_from_job().empty() ? "-" : Printable(j.resumed_from_job()),
                    Printable(j.message())});
  }
  std::vector<size_t> width(rows[0].size() - 1, 0);
  for (const auto& r : rows) {
    for (size_t c = 0; c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    for (size_t c = 0; c < width.size(); ++c) absl::StrAppend(&out, r[c], std::string(width[c] - r[c].size() + 1, ' '));
    absl::StrAppend(&out, r.back(), "\n");
  }
  return out;
}

namespace {

// Each start of a job that restarted or grew: on how many workers, which
// steps, what it cost and how it ended.
void AppendAttempts(const v1::Job& j, std::string* out) {
  absl::StrAppendFormat(out, "attempts  %d (%d restarts of at most [job] max_restarts; %d workers asked), goodput %.3f\n",
                        j.attempts_size(), j.restarts(), j.requested_workers(),
                        JobGoodput(j, absl::ToUnixMillis(absl::Now())));
  absl::StrAppendFormat(out, "  %-3s %-7s %-14s %-15s %-19s %-8s %s\n", "#", "WORKERS", "STRATEGY", "STEPS", "STARTED",
                        "LOST", "END");
  for (int i = 0; i < j.attempts_size(); ++i) {
    const v1::Attempt& a = j.attempts(i);
    absl::StrAppendFormat(out, "  %-3d %-7d %-14s %-15s %-19s %-8s %s\n", i + 1, a.world_size(), Printable(a.strategy()),
                          absl::StrCat(a.first_step(), "-", a.ended_unix_ms() ? absl::StrCat(a.last_step()) : ""),
                          absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(a.started_unix_ms()),
                                           absl::LocalTimeZone()),
                          a.lost_seconds() > 0 ? absl::StrFormat("%.1fs", a.lost_seconds()) : "-",
                          a.ended_unix_ms() ? Printable(a.end()) : "running");
  }
}

// Rank 0's steps of the kept run (status --history).
void AppendHistory(const v1::Job& j, std::string* out) {
  absl::StrAppendFormat(out, "\n%-8s %-10s %-10s %-10s %-10s %s\n", "STEP", "LOSS", "LR", "GRAD_NORM", "TOK/S",
                        "VAL_LOSS");
  for (const v1::StepRecord& s : j.history()) {
    absl::StrAppendFormat(out, "%-8d %-10.4f %-10.3g %-10.4f %-10.0f %s\n", s.step(), s.loss(), s.lr(),
                          s.grad_norm(), s.tokens_per_second(),
                          s.has_val_loss() ? absl::StrFormat("%.4f", s.val_loss()) : "-");
  }
}

}  // namespace

std::string JobDetails(const v1::Job& j) {
  const bool reported = HasReportedStep(j);
  std::string out = absl::StrFormat(
      "job       %s (%s)\nstate     %s\nstep      %d/%d\nloss      %s\ntokens/s  %s\nlr        %.3g\n"
      "grad norm %.4f\nworkers   %d (%s) %s\nmessage   %s\n",
      Printable(j.id()), Printable(j.name()), JobStateName(j.state()), j.step(), j.steps(),
      reported ? absl::StrFormat("%.4f", j.loss()) : "-", reported ? absl::StrFormat("%.0f", j.tokens_per_second()) : "-",
      j.lr(), j.grad_norm(), j.workers(), Printable(j.strategy()), Printable(absl::StrJoin(j.worker_ids(), ",")),
      Printable(j.message()));
  if (const double epoch = EpochAt(j.step(), j.batch_size(), j.sequences_per_epoch()); !std::isnan(epoch)) {
    absl::StrAppendFormat(&out, "epoch     %.2f (%d sequences per epoch; %s)\n", epoch, j.sequences_per_epoch(),
                          epoch > 1 ? absl::StrFormat("the data wrapped %d time%s", static_cast<int64_t>(epoch),
                                                      epoch >= 2 ? "s" : "")
                                    : "the first pass");
  }
  if (!j.resume_from().empty() || !j.resumed_from_job().empty()) {
    absl::StrAppendFormat(&out, "resumed   from %s at step %d (%s)\n",
                          j.resumed_from_job().empty() ? "a checkpoint of no known job" : Printable(j.resumed_from_job()),
                          j.resumed_from_step(), Printable(j.resume_from()));
  }
  if (j.has_val_loss()) absl::StrAppendFormat(&out, "val loss  %.4f (after step %d)\n", j.val_loss(), j.val_step());
  if (!j.strategy_reason().empty()) absl::StrAppend(&out, "strategy  ", Printable(j.strategy_reason()), "\n");
  if (!j.stalled().empty()) absl::StrAppend(&out, "STALLED   ", Printable(j.stalled()), "\n");
  if (!j.straggler().empty()) absl::StrAppend(&out, "STRAGGLER ", Printable(j.straggler()), "\n");
  if (j.attempts_size() > 1) AppendAttempts(j, &out);
  if (j.history_size() > 0) AppendHistory(j, &out);
  if (j.ranks_size() == 0) return out;
  absl::StrAppendFormat(&out, "\n%-5s %-16s %-7s %-10s %-9s %-9s %-10s %-13s %s\n", "RANK", "HOST", "STEP",
                        "COLL_SEQ", "LAG_STEP", "LAG_COLL", "HEARTBEAT", "NO_PROGRESS", "");
  for (const auto& r : j.ranks()) {
    absl::StrAppendFormat(&out, "%-5d %-16s %-7d %-10d %-9d %-9d %-10s %-13s %s\n", r.rank(), Printable(r.host()), r.step(),
                          r.last_collective_seq(), r.lag_steps(), r.lag_collectives(),
                          absl::StrFormat("%.1fs", r.heartbeat_age_seconds()),
                          absl::StrFormat("%.1fs", r.seconds_since_progress()), r.stalled() ? "STALLED" : "");
  }
  return out;
}

std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers) {
  std::string out = absl::StrFormat("%-6s %-20s %-8s %-6s %-10s %-5s %-15s %s\n", "ID", "HOST", "DEVICE", "STATE",
                                    "JOB", "RANK", "ADDRESS", "HEARTBEAT");
  for (const auto& w : workers) {
    absl::StrAppendFormat(&out, "%-6s %-20s %-8s %-6s %-10s %-5s %-15s %.1fs ago\n", Printable(w.worker_id()),
                          Printable(w.host()), Printable(w.device()), WorkerStateName(w.state()),
                          w.job_id().empty() ? "-" : Printable(w.job_id()),
                          w.job_id().empty() ? "-" : absl::StrCat(w.rank()),
                          w.collective_address().empty() ? "-" : Printable(w.collective_address()),
                          w.heartbeat_age_seconds());
  }
  return out;
}

std::string ShardsTable(const v1::Ownership& o) {
  std::string out = absl::StrFormat("job %s: %s, %d ranks, shard group size %d\n", o.job_id(), o.strategy(),
                                    o.world_size(), o.shard_group_size());
  absl::StrAppendFormat(&out, "%-8s %10s %10s", "UNIT", "NUMEL", "PADDED");
  for (int r = 0; r < o.shard_group_size(); ++r) absl::StrAppendFormat(&out, " %21s", absl::StrCat("rank ", r));
  out += "\n";
  for (const auto& u : o.units()) {
    absl::StrAppendFormat(&out, "%-8s %10d %10d", u.unit(), u.numel(), u.padded());
    for (int r = 0; r < u.group_size(); ++r) {
      absl::StrAppendFormat(&out, " %21s", absl::StrCat("[", r * u.shard(), ", ", (r + 1) * u.shard(), ")"));
    }
    out += "\n";
  }
  if (o.world_size() > o.shard_group_size()) {
    absl::StrAppendFormat(&out, "ranks r and r + %d hold the same shards (replicated groups)\n", o.shard_group_size());
  }
  return out;
}

Json ShardsObject(const v1::Ownership& o) {
  Json units = Json::array();
  for (const auto& u : o.units()) {
    units.push_back({{"unit", u.unit()},
                     {"numel", u.numel()},
                     {"padded", u.padded()},
                     {"shard", u.shard()},
                     {"group_size", u.group_size()}});
  }
  return {{"job_id", o.job_id()},
          {"strategy", o.strategy()},
          {"world_size", o.world_size()},
          {"shard_group_size", o.shard_group_size()},
          {"units", units}};
}

std::string ProgressLine(const v1::Job& j, double eta) {
  constexpr int kWidth = 30;
  const double frac = j.steps() > 0 ? std::min(1.0, static_cast<double>(j.step()) / j.steps()) : 0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
  std::string eta_s = "?";
  if (eta >= 0 && std::isfinite(eta)) {
    const int64_t s = static_cast<int64_t>(eta + 0.5);
    eta_s = absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  }
  // A resumed job starts at its checkpoint's step with nothing measured yet.
  const bool reported = HasReportedStep(j);
  return absl::StrFormat("[%s] step %d/%d  loss %s  %s tok/s  ETA %s  %s", bar, j.step(), j.steps(),
                         reported ? absl::StrFormat("%.4f", j.loss()) : "-",
                         reported ? absl::StrFormat("%.0f", j.tokens_per_second()) : "-", eta_s,
                         JobStateName(j.state()));
}

}  // namespace shardline::ctl
