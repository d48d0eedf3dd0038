// The job state machine's attempts (docs/design.md, "Control plane"): starting a
// queued job on the workers the Scheduler places it on (server/scheduler.h),
// at what world size and from which checkpoint; how an attempt ends, and
// when a job restarts or grows back.
//
// A job runs as a series of attempts (Job.attempts). An attempt that loses a
// rank or fails with a retryable error sends the job RESTARTING, to the head
// of the queue: once the attempt's surviving ranks have stopped, it starts
// again from the newest committed checkpoint at the largest world size in
// [min_workers, workers] that the idle workers and the batch allow. A job
// running below its workers grows back at its next committed checkpoint
// once enough workers are idle.
#include <algorithm>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/plural.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/job/device_spec.h"
#include "common/job/job_wire.h"
#include "common/plan/strategy_choice.h"
#include "common/spec/job_spec.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"

namespace shardline {
namespace {

// 256 bits from the system's entropy source, as hex: a rank's job-scoped
// credential, never stored and never logged.
std::string NewCredential() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 8; ++i) absl::StrAppendFormat(&out, "%08x", rd());
  return out;
}


// What an attempt's end says in Job.attempts and in a final failure.
constexpr size_t kMaxEndBytes = 300;

}  // namespace

int CoordinatorCore::RequestedWorkers(const v1::Job& j) {
  return j.requested_workers() > 0 ? j.requested_workers() : j.workers();  // records older than attempts
}

int CoordinatorCore::LargestWorld(const JobRecord& r, int lo, int hi) const {
  for (int w = hi; w >= std::max(lo, 1); --w) {
    if (ValidateJobConfig(r.config, w, r.stored.job.id()).ok()) return w;
  }
  return 0;
}

// ---- how an attempt ends ------------------------------------------------------

void CoordinatorCore::EndAttempt(JobRecord& r, const std::string& end) {
  v1::Job& j = JobOf(r);
  if (j.attempts_size() == 0) return;
  v1::Attempt* a = j.mutable_attempts(j.attempts_size() - 1);
  if (a->ended_unix_ms() != 0) return;  // ended already
  a->set_end(end.substr(0, kMaxEndBytes));
  a->set_ended_unix_ms(absl::ToUnixMillis(Now()));
  // Rank 0's progress may lag the ranks' newest commit.
  const int64_t committed = j.checkpoints_size() ? j.checkpoints(j.checkpoints_size() - 1).step() : 0;
  a->set_last_step(std::max({a->first_step(), j.step(), committed}));
}

void CoordinatorCore::FailJob(JobRecord& r, const std::string& cause_ref, const std::string& skip_worker,
                              bool retryable) {
  const std::string cause = cause_ref;  // it may be r.reported_failure, cleared below
  v1::Job& j = JobOf(r);
  StopRanks(r, cause, skip_worker);
  EndAttempt(r, cause);
  r.reported_failure.clear();
  r.link_faults.clear();
  if (retryable && j.restarts() < r.config.restart.max_restarts) {
    j.set_restarts(j.restarts() + 1);
    Restart(r, absl::StrFormat("restarting (%d of at most %d) after: %s", j.restarts(),
                               r.config.restart.max_restarts, cause));
    if (options_.events.job_restarting) options_.events.job_restarting(j.id());
    return;
  }
  FailForGood(r, cause);
}

void CoordinatorCore::Restart(JobRecord& r, const std::string& message) {
  const absl::Time now = Now();
  r.restart_by = now + absl::Seconds(r.config.restart.restart_timeout);
  r.settle_until = now + options_.restart_settle;
  r.restart_reason = message;
  Transition(r, v1::JOB_STATE_RESTARTING, message).IgnoreError();  // from RUNNING
  const std::string& id = JobOf(r).id();
  scheduler_.EnqueueFront(id);  // ahead of jobs that never ran
}

void CoordinatorCore::FailForGood(JobRecord& r, const std::string& cause) {
  const v1::Job& j = JobOf(r);
  std::string msg = cause;
  if (j.attempts_size() > 1) {
    absl::StrAppend(&msg, "; attempts:");
    for (int i = 0; i < j.attempts_size(); ++i) {
      const v1::Attempt& a = j.attempts(i);
      absl::StrAppendFormat(&msg, " [%d] %d workers, steps %d-%d: %s", i + 1, a.world_size(), a.first_step(),
                            a.last_step(), a.end().empty() ? "running" : a.end());
    }
  }
  Transition(r, v1::JOB_STATE_FAILED, msg).IgnoreError();  // from RUNNING or RESTARTING
}

void CoordinatorCore::StopRanks(JobRecord& r, const std::string& reason, const std::string& skip) {
  for (const std::string& wid : JobOf(r).worker_ids()) {
    if (wid == skip) continue;
    WorkerRecord* w = registry_.Find(wid);
    if (w == nullptr || w->info.job_id() != JobOf(r).id()) continue;
    v1::CoordinatorMessage m;
    m.mutable_cancel()->set_job_id(JobOf(r).id());
    m.mutable_cancel()->set_reason(reason);
    w->channel->Send(m);
  }
}

void CoordinatorCore::GrowAtCheckpoint(JobRecord& r, int64_t step) {
  v1::Job& j = JobOf(r);
  const int want = RequestedWorkers(j);
  if (j.state() != v1::JOB_STATE_RUNNING || j.workers() >= want || j.worker_ids_size() == 0) return;
  // The checkpoint of the last step ends the job: nothing is left to run faster.
  if (step >= r.config.train.steps) return;
  const WorkerRecord* first = registry_.Find(j.worker_ids(0));
  if (first == nullptr) return;
  const int idle = registry_.IdleOfKind(DeviceKindName(first->info.device()), r.excluded_workers);
  const int grown = LargestWorld(r, j.workers() + 1, std::min(want, j.workers() + idle));
  if (grown == 0) return;
  const std::string why =
      absl::StrFormat("stopped at the checkpoint of step %d to grow from %d to %s", step, j.workers(),
                      Plural(grown, "worker"));
  StopRanks(r, why, "");
  EndAttempt(r, why);
  Restart(r, absl::StrFormat("growing from %d to %s from the checkpoint of step %d", j.workers(),
                             Plural(grown, "worker"), step));
  r.settle_until = Now();  // the workers it grows onto are idle now
}

// ---- scheduling --------------------------------------------------------------

void CoordinatorCore::Schedule() {
  scheduler_.Run(registry_.version(), [this](const std::string& id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return TryStart(id);  // under mu_, which Schedule's caller holds
  });
}

Scheduler::StartOutcome CoordinatorCore::TryStart(const std::string& id) {
  JobRecord& r = jobs_.at(id);
  v1::Job& j = JobOf(r);
  const bool restarting = j.state() == v1::JOB_STATE_RESTARTING;
  const int want = RequestedWorkers(j);
  // A first start takes every worker asked for; a restart settles for
  // min_workers once the settling time is over.
  const int min_workers = restarting && r.config.restart.min_workers > 0 ? r.config.restart.min_workers : want;
  const int least = restarting && Now() >= r.settle_until ? min_workers : want;
  // A restarting job's message keeps why it restarts.
  const std::string doing = restarting ? absl::StrCat(r.restart_reason, "; waiting") : "waiting";
  if (restarting) {
    if (const WorkerRecord* w = registry_.AnyOnJob(id)) {
      j.set_message(absl::StrFormat("%s for %s on %s to stop its last attempt", doing,
                                    w->info.rank() >= 0 ? absl::StrCat("rank ", w->info.rank()) : "a worker",
                                    w->info.host()));
      return Scheduler::StartOutcome::kWaitsForIdle;
    }
  }
  WorkerRegistry::Census census = registry_.Count(r.excluded_workers);
  Scheduler::Placement place = Scheduler::Place(
      census, least, want, [&](int lo, int hi) ABSL_NO_THREAD_SAFETY_ANALYSIS { return LargestWorld(r, lo, hi); });
  if (place.world > 0) {
    StartOn(r, std::move(place.workers), place.world);
    return Scheduler::StartOutcome::kStarted;
  }
  const auto& idle_by_kind = census.idle_by_kind;
  const auto& registered_by_kind = census.registered_by_kind;
  int most = 0, idle_most = 0;
  std::string registered, idle;
  for (const auto& [kind, n] : registered_by_kind) {
    most = std::max(most, n);
    absl::StrAppend(&registered, registered.empty() ? "" : ", ", n, " ", kind);
  }
  for (const auto& [kind, ws] : idle_by_kind) {
    idle_most = std::max<int>(idle_most, ws.size());
    absl::StrAppend(&idle, idle.empty() ? "" : ", ", ws.size(), " ", kind);
  }
  const std::string what = least == want ? absl::StrCat(want) : absl::StrCat(least, " to ", want);
  const char* plural = least == want && want == 1 ? "" : "s";
  // A restart that could settle for the workers registered holds the queue
  // while it waits for more: they are its own, coming back.
  if (most < min_workers) {
    j.set_message(absl::StrFormat("%s for %s worker%s of one device kind (registered: %s); later jobs that fit start "
                                  "ahead of it",
                                  doing, what, plural, registered.empty() ? "none" : registered));
    return Scheduler::StartOutcome::kTooFewRegistered;
  }
  j.set_message(absl::StrFormat("%s for %s idle worker%s of one device kind (idle: %s)", doing, what, plural,
                                idle.empty() ? "none" : idle));
  return Scheduler::StartOutcome::kWaitsForIdle;
}

void CoordinatorCore::CloseLastAttempt(JobRecord& r, int64_t first_step) {
  v1::Job& j = JobOf(r);
  // Saves the last attempt left half-written are no checkpoints; its ranks
  // have all stopped (TryStart waited for them).
  committer_.DropReports(j.id());
  committer_.RemoveInterruptedSaves(j, INT64_MAX);
  v1::Attempt& last = *j.mutable_attempts(j.attempts_size() - 1);
  const int64_t ran = last.last_step() - last.first_step();
  const double seconds = (last.ended_unix_ms() - last.started_unix_ms()) / 1e3;
  if (ran > 0 && last.last_step() > first_step) {
    last.set_lost_seconds(seconds * static_cast<double>(last.last_step() - std::max(first_step, last.first_step())) /
                          static_cast<double>(ran));
  }
  const double down = (absl::ToUnixMillis(Now()) - last.ended_unix_ms()) / 1e3;
  if (options_.events.job_restarted) options_.events.job_restarted(last.lost_seconds() + std::max(0.0, down));
}

void CoordinatorCore::StartOn(JobRecord& r, std::vector<WorkerRecord*> idle, int world) {
  v1::Job& j = JobOf(r);
  // Ranks are stable: by host, then device, then registration order; ranks
  // of one host are consecutive, so hybrid shard groups stay within a host.
  std::sort(idle.begin(), idle.end(), [](const WorkerRecord* a, const WorkerRecord* b) {
    return std::make_tuple(a->info.host(), a->info.device(), a->info.worker_id().size(), a->info.worker_id()) <
           std::make_tuple(b->info.host(), b->info.device(), b->info.worker_id().size(), b->info.worker_id());
  });
  // From the newest committed checkpoint; else where the submit said.
  std::string resume = j.resume_from();
  int64_t first_step = 0;
  if (j.checkpoints_size() > 0) {
    resume = j.checkpoints(j.checkpoints_size() - 1).path();
    first_step = j.checkpoints(j.checkpoints_size() - 1).step();
  } else if (!resume.empty()) {
    absl::StatusOr<CheckpointManifest> m = ReadManifest(resume);
    if (m.ok()) first_step = m->step;
  }
  const bool restart = j.attempts_size() > 0;
  if (restart) CloseLastAttempt(r, first_step);
  if (r.config.parallelism.auto_strategy) PickStrategy(r, idle, world);
  j.clear_worker_ids();
  RevokeStoreAccess(r);
  r.previous_credentials = std::move(r.credentials);
  r.credentials.clear();
  j.set_workers(world);
  const std::string spec = EncodeJobConfig(r.config);  // with the attempt's strategy (PickStrategy)
  for (int rank = 0; rank < world; ++rank) {
    WorkerRecord* w = idle[rank];
    WorkerRegistry::Assign(*w, j.id(), rank);
    j.add_worker_ids(w->info.worker_id());
    v1::CoordinatorMessage m;
    v1::Assignment* a = m.mutable_start();
    a->set_job_id(j.id());
    a->set_spec(spec);
    a->set_rank(rank);
    a->set_world_size(world);
    a->set_resume_from(resume);
    a->set_resume_from_is_real_path(!resume.empty() && resume == j.resume_from());
    a->set_checkpoint_root(j.checkpoint_root());
    a->set_credential(NewCredential());
    a->set_attempt(j.attempts_size() + 1);  // the Attempt added below
    r.credentials[rank] = a->credential();
    rendezvous_.Grant(a->credential(), j.id());
    w->channel->Send(m);
  }
  v1::Attempt* a = j.add_attempts();
  a->set_world_size(world);
  a->set_strategy(j.strategy());
  a->set_first_step(first_step);
  a->set_last_step(first_step);
  a->set_started_unix_ms(absl::ToUnixMillis(Now()));
  j.set_step(first_step);
  // The history keeps the run that counts: steps past the checkpoint are
  // computed again by this attempt.
  auto* h = &r.history;
  while (!h->empty() && h->Get(h->size() - 1).step() > first_step) h->RemoveLast();
  r.started = Now();
  r.connected_ranks.clear();
  r.finished_ranks.clear();
  r.progress.clear();
  r.reported_failure.clear();
  r.link_faults.clear();
  r.send_seconds.clear();
  r.slow_rank = -1;
  j.clear_straggler();
  std::string msg = absl::StrCat("running on ", Plural(world, "worker"));
  if (world < RequestedWorkers(j)) absl::StrAppendFormat(&msg, " of %d (min_workers %d)", RequestedWorkers(j), r.config.restart.min_workers);
  if (restart) absl::StrAppendFormat(&msg, ", attempt %d from step %d", j.attempts_size(), first_step);
  if (r.config.parallelism.auto_strategy) absl::StrAppend(&msg, "; ", j.strategy_reason());
  Transition(r, v1::JOB_STATE_RUNNING, msg).IgnoreError();  // queued: PENDING or RESTARTING
}

namespace {

// The cluster `world` of `ranks` make for strategy = "auto", with the figures
// the job's ranks measured at its last rendezvous.
AttemptCluster AttemptOf(const std::vector<WorkerRecord*>& ranks, int world, const v1::Job& measured) {
  AttemptCluster a;
  a.world = world;
  std::map<std::string, int> ranks_on;  // by host
  for (int i = 0; i < world; ++i) {
    const v1::WorkerInfo& w = ranks[i]->info;
    ++ranks_on[w.host()];
    a.min_memory_bytes = i == 0 ? w.memory_bytes() : std::min<int64_t>(a.min_memory_bytes, w.memory_bytes());
    a.device_kind = DeviceKindName(w.device());
  }
  a.hosts = static_cast<int>(ranks_on.size());
  const int first = ranks_on.empty() ? 0 : ranks_on.begin()->second;
  const bool even = std::all_of(ranks_on.begin(), ranks_on.end(), [&](const auto& h) { return h.second == first; });
  a.ranks_per_host = even ? first : 0;
  a.measured_bus_bandwidth = measured.measured_bus_bandwidth();
  a.measured_flops = measured.measured_compute_flops();
  a.measured_comm_cpu_s_per_byte = measured.measured_comm_cpu_s_per_byte();
  return a;
}

// Whether the attempt configured by `c` runs what `pick` says.
bool RunsThePick(const JobConfig& c, const StrategyChoice& pick) {
  return c.parallelism.strategy == pick.strategy && c.train.grad_accumulation == pick.grad_accumulation &&
         c.parallelism.sparse_embedding == pick.sparse_embedding &&
         (!IsHybrid(pick.strategy) || c.parallelism.shard_group_size == pick.shard_group_size);
}

}  // namespace

void CoordinatorCore::PickStrategy(JobRecord& r, const std::vector<WorkerRecord*>& ranks, int world) {
  v1::Job& j = JobOf(r);
  r.picked_unmeasured = j.measured_bus_bandwidth() <= 0;
  absl::StatusOr<StrategyChoice> choice =
      ChooseStrategy(r.config, AttemptOf(ranks, world, j));
  if (!choice.ok()) {
    // The planner refused the model (it passed ValidateJobConfig): keep
    // full_shard, the strategy of least memory, and say why.
    r.config.parallelism.strategy = Strategy::kFullShard;
    j.set_strategy_reason(absl::StrCat("auto: full_shard (the planner failed: ", choice.status().message(), ")"));
  } else {
    r.config.parallelism.strategy = choice->strategy;
    r.config.parallelism.shard_group_size = choice->shard_group_size;  // a host's ranks for a hybrid
    r.config.train.grad_accumulation = choice->grad_accumulation;  // the job's own unless left to auto
    r.config.parallelism.sparse_embedding = choice->sparse_embedding;  // likewise
    j.set_strategy_reason(choice->why);
  }
  j.set_strategy(StrategyName(r.config.parallelism.strategy));
}

void CoordinatorCore::PickAgainOnTheMeasuredLink(JobRecord& r) {
  v1::Job& j = JobOf(r);
  if (!r.picked_unmeasured || j.measured_bus_bandwidth() <= 0 || j.state() != v1::JOB_STATE_RUNNING) return;
  r.picked_unmeasured = false;
  std::vector<WorkerRecord*> ranks;
  for (const std::string& id : j.worker_ids()) {
    WorkerRecord* w = registry_.Find(id);
    if (w == nullptr) return;  // a lost worker restarts the job anyway, and it picks again then
    ranks.push_back(w);
  }
  const double measured = j.measured_bus_bandwidth();
  absl::StatusOr<StrategyChoice> choice = ChooseStrategy(r.config, AttemptOf(ranks, j.worker_ids_size(), j));
  if (!choice.ok() || RunsThePick(r.config, *choice)) return;
  const std::string why = absl::StrFormat(
      "stopped after its rendezvous: on the %.3g GB/s its ranks measured, auto picks %s", measured / 1e9,
      StrategyName(choice->strategy));
  StopRanks(r, why, "");
  EndAttempt(r, why);
  Restart(r, absl::StrFormat("restarting with the strategy picked on the %.3g GB/s its ranks measured",
                             measured / 1e9));
}

}  // namespace shardline
