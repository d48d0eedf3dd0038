#include "worker/run/job_runner.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace shardline {

JobRunner::JobRunner(JobRun run, CheckpointSink* sink, JobHooks hooks)
    : run_(std::move(run)), sink_(sink), hooks_(std::move(hooks)) {}

JobRunner::~JobRunner() { (void)WaitForSave(); }

absl::Status JobRunner::Start(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<const Device> device,
                              Backend backend) {
  const GroupPlan plan = PlanGroups(run_.config, run_.rank, run_.world);
  SL_ASSIGN_OR_RETURN(Communicators comms,
                      ConnectGroups(store, plan, *device, backend, run_.collective_timeout, run_.collective_address));
  if (hooks_.opened) hooks_.opened(comms);
  // The group that spans the job, where one does: the shard group, or
  // no_shard's replicate group (none in a two-level hybrid).
  comm::Communicator* world_group = comms.shard->size() == run_.world       ? comms.shard.get()
                                    : comms.replicate->size() == run_.world ? comms.replicate.get()
                                                                            : nullptr;
  AutoFigures figures;
  if (run_.config.parallelism.auto_strategy && run_.world > 1) {
    // A two-level hybrid auto picked measures over its replicate groups, one
    // rank of each host (its shard groups are the hosts), all at once: a
    // host's link carries shard-group-size of their flows, so that many
    // times one flow's figure is what the world's ring measures between them.
    comm::Communicator& over = world_group ? *world_group : *comms.replicate;
    SL_ASSIGN_OR_RETURN(figures, MeasureAutoFigures(over, world_group ? 1 : comms.shard->size(), run_.config,
                                                    *device, run_.collective_timeout));
  }
  // Where the world's group broadcasts from the root to each rank (host
  // backends; NCCL pipelines it through every link, which tells hosts apart
  // no more).
  std::vector<double> send_seconds;
  if (run_.world > 1 && world_group && !world_group->ordered_on_device()) {
    SL_ASSIGN_OR_RETURN(send_seconds, MeasureSendSeconds(*world_group, *device, run_.collective_timeout));
  }
  if (hooks_.connected) hooks_.connected(comms, figures, send_seconds);
  std::vector<comm::Communicator*> groups = {comms.shard.get(), comms.replicate.get()};
  SL_ASSIGN_OR_RETURN(engine_, Engine::Create(run_.config, run_.rank, run_.world, std::move(device), std::move(comms),
                                              run_.collective_timeout));
  absl::MutexLock lock(&comms_mu_);
  comms_ = std::move(groups);
  if (cancel_) AbortComms();
  return absl::OkStatus();
}

void JobRunner::Cancel() {
  cancel_ = true;
  absl::MutexLock lock(&comms_mu_);
  AbortComms();
}

void JobRunner::AbortComms() {
  for (comm::Communicator* c : comms_) {
    if (c) c->Abort(absl::CancelledError(absl::StrCat("rank ", run_.rank, " was told to stop")));
  }
}

bool JobRunner::WantsTimedSave() const {
  const double every = run_.config.checkpoint.interval_seconds;
  return every > 0 && absl::Now() - last_save_ >= absl::Seconds(every);
}

absl::Status JobRunner::Run() {
  int64_t start = 0;
  if (!run_.resume_from.empty()) {
    SL_ASSIGN_OR_RETURN(CheckpointManifest m, LoadCheckpoint(*engine_, run_.config, run_.resume_from));
    start = m.step;
    engine_->device().ReleaseCachedMemory();  // the load's buffers are not a step's
  }
  step_ = start;
  last_save_ = absl::Now();
  const int64_t end = run_.stop_after > 0 ? std::min<int64_t>(run_.stop_after, run_.config.train.steps)
                                          : run_.config.train.steps;
  const int interval = run_.config.checkpoint.interval;
  NonFiniteSteps nonfinite(run_.config.train.max_nonfinite_skips);
  for (int64_t s = start; s < end; ++s) {
    if (cancel_) {
      (void)WaitForSave();
      return absl::CancelledError(absl::StrCat("stopped before step ", s));
    }
    StepOptions options;
    options.vote_save = save_requested_.exchange(false) || WantsTimedSave();
    options.next_step_follows = s + 1 < end;
    absl::StatusOr<StepResult> r = engine_->Step(s, options);
    if (!r.ok()) {
      (void)WaitForSave();
      // Told to stop while the step waited on a collective: the abort that
      // ended the wait is not the step's failure.
      if (cancel_) return absl::CancelledError(absl::StrCat("stopped in step ", s, " (", r.status().message(), ")"));
      return r.status();
    }
    step_ = s + 1;
    absl::Status s_ok = hooks_.stepped ? hooks_.stepped(*r, *engine_) : absl::OkStatus();
    if (s_ok.ok()) s_ok = nonfinite.Check(*r);
    // A save that failed in the background fails the job now, naming why,
    // not at the next save or at the end of the run.
    if (s_ok.ok() && save_done_ && save_thread_.joinable()) s_ok = WaitForSave();
    // The job's last step (not a --stop-after's), where no other reason saved it.
    const bool at_end = run_.config.checkpoint.at_end && s + 1 == run_.config.train.steps;
    if (s_ok.ok() && ((interval > 0 && (s + 1) % interval == 0) || r->save || run_.save_at == s + 1 || at_end)) {
      s_ok = Save(s + 1);
    }
    if (!s_ok.ok()) {
      (void)WaitForSave();
      return s_ok;
    }
  }
  return WaitForSave();  // the last checkpoint is committed before the rank reports done
}

absl::Status JobRunner::WaitForSave() {
  if (!save_thread_.joinable()) return absl::OkStatus();
  save_thread_.join();
  return save_status_;
}

absl::Status JobRunner::Save(int64_t step) {
  SL_RETURN_IF_ERROR(WaitForSave());  // one save in flight at most
  last_save_ = absl::Now();
  auto write = [this, step](const ShardSnapshot& snap) -> absl::Status {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<int64_t> bytes = sink_->Save(snap, step);
    if (hooks_.saved) hooks_.saved(absl::ToDoubleSeconds(absl::Now() - t0), bytes.ok() ? *bytes : 0, bytes.ok());
    return bytes.status();
  };
  SL_ASSIGN_OR_RETURN(ShardSnapshot snap, SnapshotShards(*engine_, /*copy=*/run_.config.checkpoint.async));
  if (!run_.config.checkpoint.async) return write(snap);
  // The step loop pays only for this copy; the write runs beside training.
  save_done_ = false;
  save_thread_ = std::thread([this, write, snap = std::move(snap)] {
    save_status_ = write(snap);
    save_done_ = true;
  });
  return absl::OkStatus();
}

}  // namespace shardline
