// CoordinatorCore: the job state machine and the public API the gRPC
// service calls, composed of named parts that each own their data and state
// their own contract: the WorkerRegistry (server/worker_registry.h), the
// Scheduler's queue and placement (server/scheduler.h), the RendezvousStore
// (server/rendezvous_store.h), the CheckpointCommitter
// (server/checkpoint_committer.h) and JobLogs (server/job_logs.h). The parts
// know nothing of each other or of jobs' states; the core calls them under
// its one mutex and decides what their results mean for a job. Plain C++:
// the gRPC service is a thin adapter over it, and unit tests drive it
// without a network.
//
// Jobs move PENDING -> RUNNING -> (RESTARTING -> RUNNING)* -> SUCCEEDED |
// FAILED | CANCELLED (common/state/job_state.h); the reason is kept in Job.message;
// a failure names its root cause where one is known. A lost rank, or a rank
// that fails because of a peer, sends a job with restarts left ([job]
// max_restarts) to RESTARTING: once its old ranks are back, it starts again
// from its newest committed checkpoint at the largest world size in
// [min_workers, workers] that the idle workers and the batch allow, or FAILS
// after restart_timeout naming every attempt. A rank's own error fails it at
// once. Every change is written to the StateStore before it
// is visible to watchers.
//
// Workers talk to the core through a WorkerChannel (the session stream). A
// worker whose channel closes, or whose heartbeats stop for `lost_after`, is
// lost: its running job restarts (or fails) naming the rank and host, and the
// job's other ranks are told to stop (they return to idle when they report
// back). Starting, ending and restarting attempts are in
// coordinator_scheduler.cc.
//
// Thread-safe. Callbacks (channel sends, watchers, store waiters) may be
// invoked with the core's lock held and must not call back into the core.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/job/job_config.h"
#include "common/job/job_file.h"
#include "nlohmann/json.hpp"
#include "server/checkpoint_committer.h"
#include "server/job_logs.h"
#include "server/rendezvous_store.h"
#include "server/scheduler.h"
#include "server/state_store.h"
#include "server/worker_registry.h"
#include "shardline/v1/shardline.pb.h"

namespace shardline {

// Optional hooks for the coordinator's metrics; called with the core's lock
// held, so they must be cheap and must not call back into the core.
struct CoreEvents {
  std::function<void(absl::Duration)> rendezvous_done;  // a job's ranks all connected
  std::function<void(absl::Duration, bool ok)> checkpoint_committed;
  std::function<void()> worker_lost;
  // A message or call refused because its sender does not hold the rank it
  // names (`what`: progress, finished, connected, checkpoint_report).
  std::function<void(const char* what)> refused;
  // A job went RESTARTING after a lost rank or a retryable error.
  std::function<void(const std::string& job_id)> job_restarting;
  // An attempt started after an earlier one ended: the seconds the restart
  // cost (the last attempt's steps computed again, plus the time between).
  std::function<void(double lost_seconds)> job_restarted;
  // One line of the coordinator's log (EventLog::Emit): a job submitted or
  // changing state (a restart, a cancel), a worker joining or lost, a
  // checkpoint committed or not.
  std::function<void(std::string_view event, nlohmann::ordered_json fields)> log;
};

struct CoordinatorOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  int lost_after_missed = 3;  // heartbeats
  // A rank's failure report is held this long before it fails the job: when
  // a peer dies, the survivors' collectives fail at once, often before the
  // dead worker's session is seen to drop, and the job should name the root
  // cause (the lost worker), not the first rank that noticed.
  absl::Duration failure_grace = absl::Seconds(1);
  // The grace while some rank has not connected yet: a rank whose Gloo
  // rendezvous failed probes its peers before it reports (at most 2 s and
  // a store read a peer: worker/comm/link_probe.h) to name the link, while
  // a peer that did connect may have timed out in its first collective.
  absl::Duration rendezvous_failure_grace = absl::Seconds(4);
  // A running job none of whose ranks advanced a step or a collective for
  // this long is stalled: GetJob names the rank(s) at fault (Job.stalled)
  // and the metrics flag them. Informational: the job keeps running.
  absl::Duration stall_after = absl::Seconds(10);
  // A restarting job waits this long for as many workers as its last
  // attempt had (a coordinator that restarted, a worker that reconnects)
  // before it settles for fewer, down to [job] min_workers.
  absl::Duration restart_settle = absl::Seconds(3);
  // Ended jobs are forgotten (their records; never their checkpoints) past
  // this many, oldest first, and once they ended this long ago (zero: kept
  // at any age).
  int keep_finished_jobs = 1000;
  absl::Duration keep_finished_for = absl::ZeroDuration();
  // Jobs waiting to start at most (PENDING or RESTARTING): a caller cannot
  // make the coordinator hold unbounded specs (Submit: ResourceExhausted).
  size_t max_queued_jobs = 10000;
  // Of those, at most this many one user's (one token; jobs submitted
  // without authentication count as one user): one user cannot fill the
  // queue, nor the coordinator's memory and state with specs.
  size_t max_queued_jobs_per_user = 1000;
  // A running job's progress is written to the state at most this often
  // (changes of state at once).
  absl::Duration persist_progress_every = absl::Seconds(1);
  CoreEvents events;
  // The time every record and deadline is taken from (tests drive a fake).
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

class CoordinatorCore {
 public:
  using JobCallback = std::function<void(const v1::Job&)>;
  // A store wait's outcome: OK with the values of the awaited keys, or an error.
  using DoneCallback = RendezvousStore::DoneCallback;

  CoordinatorCore(StateStore* store, CoordinatorOptions options);

  // Workers retry a lost session with a backoff capped at 5 s
  // (worker/worker_daemon.cc): a coordinator that restarted hears from all
  // of them within this.
  static constexpr absl::Duration kWorkersReconnectWithin = absl::Seconds(6);

  // Loads every job from the store. Jobs that were RUNNING when the previous
  // coordinator died restart like a job that lost a rank (their workers are
  // told to stop when they reconnect, then the job starts again from its
  // newest committed checkpoint); PENDING jobs are queued again in
  // submission order.
  //
  // A row that does not read (its record does not parse or is NULL, its id
  // is not its record's, its state is no state, or a job that has not ended
  // has a spec that is NULL or does not parse) stops nothing: the other jobs
  // load and serve. It is listed as a FAILED job (under its id, or
  // "unreadable-row-<seq>" without one) whose message names the database,
  // the row and the problem, and is never written, retired or deleted by
  // the coordinator: the row stays as it is for the operator. Its job number
  // is never given again. One line per such row (and per ended job whose
  // spec does not parse, loaded as it ended) goes to `problems` if given,
  // for the start log. An error only if the store cannot be read at all.
  absl::Status Recover(std::vector<std::string>* problems = nullptr);

  // ---- workers (from session streams) ----
  // A worker that says it still runs a job (info.job_id) is told to stop it.
  // The job waits for it (a restart, a delete) only if the claim is proven:
  // info.claim_credential is the credential of rank info.rank of that job's
  // running or previous attempt. Otherwise the claim is counted as refused
  // and the worker is only busy until it reports that job finished.
  absl::StatusOr<v1::Registered> RegisterWorker(v1::WorkerInfo info, WorkerChannel* channel);
  // The session ended; the channel must not be used after this returns.
  void WorkerGone(const std::string& worker_id, const std::string& why);
  // A session is the identity of the rank assigned to it: progress, a
  // rank's end and its rendezvous are taken only from the session that
  // holds that rank of that job (anything else is ignored and counted as
  // refused).
  void OnHeartbeat(const std::string& worker_id, const v1::Heartbeat& hb);
  void OnProgress(const std::string& worker_id, const v1::Progress& p);
  void OnFinished(const std::string& worker_id, const v1::RankFinished& f);
  void OnConnected(const std::string& worker_id, const v1::RankConnected& c);
  // A line of a rank's log, from the session holding that rank (JobLogs):
  // kept, cut to kMaxLogLineBytes, in a tail of kLogLinesPerRank per rank,
  // within kMaxLogBytes over all jobs (the logs of the jobs that ended first
  // go first). In memory only: a restarted coordinator starts without them.
  void OnLog(const std::string& worker_id, const v1::LogLine& line);
  static constexpr size_t kMaxLogLineBytes = 1024, kLogLinesPerRank = 500, kMaxLogBytes = 64 << 20;
  // Of a rank's own error text (RankFinished.message) kept in the job's message.
  static constexpr size_t kMaxRankMessageBytes = 1024;

  // Counts a call refused before it reached the core (`what`: "role").
  void CountRefused(const char* what) const {
    if (options_.events.refused) options_.events.refused(what);
  }

  // ---- jobs (from clients) ----
  // Job files of at most kMaxSpecBytes and paths of at most kMaxPathBytes.
  static constexpr size_t kMaxSpecBytes = kMaxJobFileBytes, kMaxPathBytes = 4096;
  // `owner` (Job.owner): the hex SHA-256 of the submitting user token, or
  // empty without authentication; the service checks it on cancel and delete.
  // A job's id is never one whose checkpoint directory (<checkpoint
  // root>/job-N) already exists: that id is passed over (its files, of a
  // job the state no longer knows, stay untouched). Refused if the job's
  // record cannot be saved (naming the database and the cause).
  absl::StatusOr<std::string> Submit(const v1::SubmitJobRequest& req, const std::string& owner = "");
  // With Job.spec_toml; without Job.history unless `history`.
  absl::StatusOr<v1::Job> GetJob(const std::string& id, bool history = false) const;
  // Without their spec or history: a listing copies every job, and a spec may
  // be kMaxSpecBytes.
  std::vector<v1::Job> ListJobs() const;
  // Jobs [first, first + max) of that oldest-first list (none past its end),
  // copying only those; *total: how many there are.
  std::vector<v1::Job> ListJobs(uint64_t first, size_t max, size_t* total) const;
  // How many times a queued job was looked at to be started (TryStart):
  // what scheduling costs, for tests.
  int64_t start_attempts() const {
    absl::MutexLock lock(&mu_);
    return scheduler_.start_attempts();
  }
  // Job.owner of job `id` (empty: none); NotFound if there is no such job.
  absl::StatusOr<std::string> OwnerOfJob(const std::string& id) const;
  // The job whose checkpoint `step_dir` is: the job its manifest names, when
  // `step_dir` resolved (symlinks followed) lies under that job's resolved
  // checkpoint root; empty for any other directory (a copy, shardline-train's).
  absl::StatusOr<std::string> JobOfCheckpoint(const std::string& step_dir) const;
  // The same for a manifest already read from `step_dir`.
  std::string JobOfCheckpoint(const std::string& step_dir, const CheckpointManifest& m) const;
  // Job.history's bound: past it the older half is thinned to every other step.
  static constexpr int kMaxHistory = 4096;
  // A job whose record the state database failed to save says so at the end
  // of Job.message, in one note of at most this many bytes (" [state not
  // saved: <cause>]", the latest failure's), gone once a write succeeds.
  static constexpr size_t kMaxUnsavedNoteBytes = 512;
  // Ends a job that has not ended (CANCELLED; a running one's ranks are told
  // to stop); FailedPrecondition if it already ended.
  absl::StatusOr<v1::Job> Cancel(const std::string& id);
  // Forgets a job that has ended: its record, and with `checkpoints` its
  // committed and interrupted step directories (the count removed). A
  // PENDING or RUNNING job is refused (FailedPrecondition: cancel it first),
  // and so is one whose row did not read (Recover): the operator's to mend.
  absl::StatusOr<int> Delete(const std::string& id, bool checkpoints);
  std::vector<v1::WorkerInfo> ListWorkers() const;
  absl::StatusOr<v1::Ownership> GetOwnership(const std::string& id) const;
  // A rank's report that its shard of `step` is written; when every rank
  // reported a step, the manifest is written (last) and the checkpoint is
  // committed, then [checkpoint] keep_latest is applied and interrupted saves
  // are removed. A manifest that cannot be written fails the job, naming
  // why; so does a report or a record the state database cannot save (at
  // once, without a restart: it is the coordinator's fault, named with the
  // database file and the cause, never a rank's). Refused
  // (PermissionDenied, counted) without that rank's credential of the
  // running attempt (Assignment.credential); then unless the job is RUNNING
  // and the report names that rank's own file of that step under the job's
  // checkpoint root (RankFilePath) with a SHA-256.
  absl::Status ReportCheckpoint(const v1::CheckpointReport& report, const std::string& credential);
  absl::Status CheckpointNow(const std::string& id);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(const std::string& id) const;
  // The job's kept log lines after `after_seq` (of rank `rank`, or all for
  // -1), in arrival order, and whether the job has ended.
  absl::StatusOr<v1::GetLogsResponse> GetLogs(const std::string& id, int rank, int64_t after_seq) const;

  // Calls `cb` with the job now and after every change; returns a handle for
  // Unwatch. NotFound if there is no such job.
  absl::StatusOr<int> Watch(const std::string& id, JobCallback cb);
  void Unwatch(int handle);

  // ---- rendezvous store ----
  // Callers are bounded (ResourceExhausted naming the limit): keys of at most
  // kMaxStoreKeyBytes, values of at most kMaxStoreValueBytes; per job (a
  // key's job is what precedes its first "/") kMaxJobStoreBytes,
  // kMaxJobStoreKeys and kMaxJobWaiters pending waits, so that one job
  // cannot starve another's rendezvous; kMaxStoreBytes, kMaxStoreKeys and
  // kMaxStoreWaiters in all; waits of at most kMaxWaitKeys keys. A job's keys
  // are dropped when it ends.
  static constexpr size_t kMaxStoreKeyBytes = RendezvousStore::kMaxKeyBytes;
  static constexpr size_t kMaxStoreValueBytes = RendezvousStore::kMaxValueBytes;
  static constexpr size_t kMaxJobStoreBytes = RendezvousStore::kMaxJobBytes;
  static constexpr size_t kMaxJobStoreKeys = RendezvousStore::kMaxJobKeys;
  static constexpr size_t kMaxJobWaiters = RendezvousStore::kMaxJobWaiters;
  static constexpr size_t kMaxStoreBytes = RendezvousStore::kMaxBytes, kMaxStoreKeys = RendezvousStore::kMaxKeys;
  static constexpr size_t kMaxWaitKeys = RendezvousStore::kMaxWaitKeys;
  static constexpr size_t kMaxStoreWaiters = RendezvousStore::kMaxWaiters;
  // Who may touch which keys: `credential` must be a rank credential of a
  // running attempt (Assignment.credential) and every key must lie in that
  // job's namespace, "<job id>/". PermissionDenied otherwise (counted as
  // "store"). The service checks this before every store call.
  absl::Status AuthorizeStore(const std::string& credential, const std::vector<std::string>& keys) const;
  absl::Status StoreSet(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> StoreGet(const std::string& key) const;  // NotFound if unset
  absl::StatusOr<int64_t> StoreAdd(const std::string& key, int64_t delta);
  bool StoreCheck(const std::vector<std::string>& keys) const;
  bool StoreDelete(const std::string& key);
  // Calls done(OK, values) once every key is set, done(DeadlineExceeded) at
  // `deadline`, or done(Cancelled) at the first Tick after `cancelled`
  // returns true (the client went away: its wait is freed then, not at its
  // deadline). After Shutdown, done(Unavailable) at once.
  void StoreWait(const std::vector<std::string>& keys, absl::Time deadline, DoneCallback done,
                 std::function<bool()> cancelled = nullptr);
  // Answers every pending store wait (Unavailable) and refuses new ones, so
  // that the server's shutdown never waits out a wait's timeout.
  void Shutdown();

  // Expires silent workers and late store waits, and starts queued jobs.
  // Called periodically (and by tests with their own clock).
  void Tick(absl::Time now);

 private:
  // What heartbeats and progress said about one rank of a running job.
  struct RankProgress {
    int64_t step = 0, seq = 0;
    absl::Time last_change;  // when step or seq last moved
  };
  // One job: its stored record and what the state machine keeps about its
  // running attempt. What the parts own (a job's store keys, checkpoint
  // reports, log lines, queue place) lives in them, by job id.
  struct JobRecord {
    StoredJob stored;  // its Job.history is empty but while it is written (PersistOrError)
    // Its row did not read (Recover): shown FAILED, never written, retired
    // or deleted, so the row stays as the operator will find it.
    bool unreadable = false;
    // Job.history, kept apart so that listings and watchers copy the job
    // without the whole curve; stored with the job.
    google::protobuf::RepeatedPtrField<v1::StepRecord> history;
    absl::Time started;                   // when it turned RUNNING
    std::set<int> connected_ranks;        // rendezvous done
    std::map<int, RankProgress> progress;  // by rank
    std::set<int> stalled_ranks;           // named in Job.stalled
    JobConfig config;
    std::set<int> finished_ranks;
    absl::Time last_persist;
    std::string reported_failure;  // first peer-caused rank failure, waiting out the grace
    // The links this attempt's ranks saw fail (RankFinished.link); at the
    // end of the grace the lowest (seq, step) is named as the cause.
    std::vector<v1::RankFinished::Link> link_faults;
    // "host/device" of workers left out of this job's later attempts: one
    // end of each link that failed, so that the job can run without it.
    std::set<std::string> excluded_workers;
    // This attempt's ranks' MeasureSendSeconds, by reporting rank; the rank
    // named the straggler (Job.straggler) once every rank reported, or -1.
    std::map<int, std::vector<double>> send_seconds;
    int slow_rank = -1;
    absl::Time fail_at;
    // Each rank's job-scoped credential (Assignment.credential), by rank;
    // a checkpoint report is accepted only with its rank's.
    std::map<int, std::string> credentials;
    // The attempt before: what a rank that still runs it proves itself with
    // when its session comes back (RegisterWorker).
    std::map<int, std::string> previous_credentials;
    absl::Time restart_by;    // while RESTARTING: when it fails instead
    absl::Time settle_until;  // while RESTARTING: until then, only all its workers will do
    std::string restart_reason;  // while RESTARTING: what Job.message leads with
    // strategy = "auto" picked this attempt before any link was measured
    // (the job's first): once its ranks measured one, it picks again.
    bool picked_unmeasured = false;
  };

  v1::Job& JobOf(JobRecord& r) { return r.stored.job; }
  // The credentials of r's ranks no longer open the store (r.credentials
  // stays, so that a late checkpoint report is told the job ended).
  void RevokeStoreAccess(const JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running job `job_id` if session `worker_id` holds its rank `rank`;
  // otherwise null, and the refusal counted under `what`.
  JobRecord* RankOfSession(const std::string& worker_id, const std::string& job_id, int rank, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes r's record. A failed write is said at the end of Job.message
  // (" [state not saved: <cause>]", at most kMaxUnsavedNoteBytes), replacing
  // the note of an earlier failure, and dropped by the next write that
  // succeeds; the in-memory state stays authoritative for this process.
  void Persist(JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank 0's progress into Job.history, within kMaxHistory.
  void AppendHistory(google::protobuf::RepeatedPtrField<v1::StepRecord>& history, const v1::Progress& p) const;
  // Persist that reports a failed write to the caller (a commit must not
  // write its manifest before the record names it). Writes nothing for an
  // unreadable record (FailedPrecondition).
  absl::Status PersistOrError(JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Persist again every job in unsaved_, at most once a second (Tick).
  void RetryUnsaved(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify(const JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A line of the coordinator's log (CoreEvents::log), if it has one.
  void Log(std::string_view event, nlohmann::ordered_json fields) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.events.log) options_.events.log(event, std::move(fields));
  }
  // Moves r to `state` by the one transition table (common/state/job_state.h),
  // persists and notifies; a repeat is a no-op, an illegal transition an
  // error that changes nothing. A final state, or RESTARTING, ends the
  // attempt's store access and keys.
  absl::Status Transition(JobRecord& r, v1::JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a running attempt with `cause` and tells its ranks to stop (except
  // `skip_worker`, whose session is gone); the job goes RESTARTING if the
  // cause is `retryable` and restarts are left, FAILED otherwise.
  void FailJob(JobRecord& r, const std::string& cause, const std::string& skip_worker, bool retryable)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's end: FAILED with `cause` and, after restarts, every attempt's.
  void FailForGood(JobRecord& r, const std::string& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends a job whose attempt ended to RESTARTING, at the head of the queue.
  void Restart(JobRecord& r, const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a commit of `step`: a job running below its workers stops there
  // and restarts larger if idle workers allow it.
  void GrowAtCheckpoint(JobRecord& r, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The largest world size in [lo, hi] the job's config allows (batch and
  // shard-group divisibility); 0 if none.
  int LargestWorld(const JobRecord& r, int lo, int hi) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static int RequestedWorkers(const v1::Job& j);
  // strategy = "auto": picks the attempt's strategy for `world` of `ranks`
  // (common/plan/strategy_choice.h) into r.config, Job.strategy and its reason.
  void PickStrategy(JobRecord& r, const std::vector<WorkerRecord*>& ranks, int world)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every rank of an attempt that auto picked without a measurement
  // reported the link it measured: where the pick on that link differs, the
  // ranks stop and the job restarts at once, from where the attempt started
  // (a grown job's way; no failure, no restart of max_restarts spent).
  void PickAgainOnTheMeasuredLink(JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the running attempt's record.
  void EndAttempt(JobRecord& r, const std::string& end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a job's rendezvous keys and its ranks' store access.
  void DropStore(const JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells a running job's ranks to stop (except `skip_worker`).
  void StopRanks(JobRecord& r, const std::string& reason, const std::string& skip_worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the scheduler's queue against the registry (TryStart).
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts queued job `id` on idle workers if enough of one device kind are
  // idle (Scheduler::Place); otherwise says in its message what it waits for.
  Scheduler::StartOutcome TryStart(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Assigns r's `world` ranks to `idle` workers (at least that many) and
  // starts an attempt, from the newest committed checkpoint if there is one.
  void StartOn(JobRecord& r, std::vector<WorkerRecord*> idle, int world) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a restart's attempt starts from `first_step`: the last attempt's
  // interrupted saves go, and what the restart cost is counted
  // (Attempt.lost_seconds, CoreEvents::job_restarted).
  void CloseLastAttempt(JobRecord& r, int64_t first_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a job's record (and with `checkpoints` its step directories).
  absl::StatusOr<int> Forget(JobRecord& r, bool checkpoints) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies keep_finished_jobs and keep_finished_for.
  void RetireEndedJobs(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoseWorker(const std::string& id, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ClaimHolds(const std::string& job_id, int rank, const std::string& credential) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The failure of an attempt whose ranks reported peer errors: the link of
  // the lowest (seq, step) named by both ends, whose receiving end is then
  // excluded from the job's next attempts; else r.reported_failure.
  std::string BlameLink(JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every rank reported its send times: the rank whose 1 MiB took at
  // least 3x the median rank's (and 50 ms, above loopback's noise), named
  // with its host in Job.straggler and RankStatus.slow_link.
  void FindSlowLink(JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // r's record writes, as the CheckpointCommitter needs them (Persist,
  // PersistOrError); called back under mu_, which the caller holds.
  CheckpointCommitter::Recorder RecorderOf(JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once a job has ended and none of its ranks still runs, its interrupted
  // saves are removed.
  void RemoveSavesOfEndedJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank health (coordinator_health.cc).
  void RecordProgress(JobRecord& r, int rank, int64_t step, int64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillRanks(const JobRecord& r, absl::Time now, v1::Job* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets or clears Job.stalled of every running job; tells watchers of changes.
  void UpdateStalls(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The resolved, validated spec of `req`, its worker count, and for a resume
  // the manifest of req.resume_from() (read once: file I/O, outside the lock).
  absl::StatusOr<JobConfig> ParseAndValidate(const v1::SubmitJobRequest& req, int* workers,
                                             std::optional<CheckpointManifest>* resume) const;

  absl::Time Now() const { return options_.clock(); }
  int64_t NowMs() const { return absl::ToUnixMillis(Now()); }

  StateStore* const store_;
  const CoordinatorOptions options_;
  mutable absl::Mutex mu_;
  WorkerRegistry registry_ ABSL_GUARDED_BY(mu_);
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  RendezvousStore rendezvous_ ABSL_GUARDED_BY(mu_);
  CheckpointCommitter committer_ ABSL_GUARDED_BY(mu_);
  JobLogs logs_ ABSL_GUARDED_BY(mu_){JobLogs::Limits{kMaxLogLineBytes, kLogLinesPerRank, kMaxLogBytes}};
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  // The RUNNING and RESTARTING jobs, kept by Transition: all that Tick's
  // health and deadline checks look at, however many jobs wait or ended.
  std::set<std::string> active_ ABSL_GUARDED_BY(mu_);
  // Jobs whose latest write failed (a full disk): written again once a
  // second (RetryUnsaved) until one lands, so that a state they reached
  // (FAILED, SUCCEEDED) is what a restarted coordinator reads once the disk
  // has room.
  std::set<std::string> unsaved_ ABSL_GUARDED_BY(mu_);
  absl::Time last_unsaved_retry_ ABSL_GUARDED_BY(mu_);
  absl::Time last_retire_ ABSL_GUARDED_BY(mu_);  // RetireEndedJobs, once a second
  std::map<int, std::pair<std::string, JobCallback>> watchers_ ABSL_GUARDED_BY(mu_);
  int next_job_ = 1, next_watch_ = 1;
};


}  // namespace shardline
