// JobRunner: one rank of one job, from rendezvous to its last step, for both
// the worker daemon and shardline-train (docs/design.md, "Layout"): it connects
// the rank's communicators over a store, builds the engine, resumes from a
// committed checkpoint, and runs the step loop: progress to the caller,
// non-finite steps ([train] max_nonfinite_skips), saves every [checkpoint]
// interval steps, every interval_seconds and when asked, and cancel. Each save
// is handed to a CheckpointSink, which commits it: the daemon reports its
// file to the coordinator, shardline-train has rank 0 write the manifest.
//
// A save decided by a clock or a request is voted on in the step's loss
// all-reduce (Engine::Step), so every rank saves after the same step.
//
// Threads: Start and Run on the job's thread; Cancel and RequestSave from
// any thread. With [checkpoint] async one save runs on a thread of its own
// while training goes on; no save outlives Run.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/job/job_config.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/comm/groups.h"
#include "worker/engine/engine.h"
#include "worker/run/rendezvous_figures.h"

namespace shardline {

// Commits one rank's shards of a step. Save may run on the save thread.
class CheckpointSink {
 public:
  virtual ~CheckpointSink() = default;
  // Writes `snap` as this rank's file of `step` and commits it (or reports
  // it to whoever commits); returns the bytes written.
  virtual absl::StatusOr<int64_t> Save(const ShardSnapshot& snap, int64_t step) = 0;
};

struct JobRun {
  JobConfig config;  // validated for `world`, paths resolved
  int rank = 0, world = 1;
  std::string resume_from;  // a committed step directory, or empty
  absl::Duration collective_timeout = absl::Seconds(60);
  // What this rank's collectives bind to (worker/run/collective_address.h).
  std::string collective_address = "127.0.0.1";
  int64_t stop_after = 0;  // stop once this step is done (0: at [train] steps)
  int64_t save_at = 0;     // also save once this step is done (0: never)
};

struct JobHooks {
  // Once the communicators are connected, before their first collective
  // (e.g. observers that must see every collective, as Stats counts them).
  std::function<void(Communicators&)> opened;
  // Once the communicators are connected, before the engine is built (e.g.
  // their observers). `figures`: with strategy = "auto", what the rank
  // measured (MeasureAutoFigures); zeros otherwise. `send_seconds`: by rank,
  // how long that rank's 1 MiB broadcast took here (MeasureSendSeconds;
  // empty where not measured).
  std::function<void(Communicators&, const AutoFigures& figures, const std::vector<double>& send_seconds)> connected;
  // After every step (before its save); an error ends the run with it.
  std::function<absl::Status(const StepResult&, const Engine&)> stepped;
  // After each save ended: its seconds, bytes and outcome.
  std::function<void(double seconds, int64_t bytes, bool ok)> saved;
};

class JobRunner {
 public:
  // `sink` must outlive the runner.
  JobRunner(JobRun run, CheckpointSink* sink, JobHooks hooks);
  ~JobRunner();  // waits for a save in flight

  // Connects the groups over `store` (null for a world of one) and builds the
  // engine. Errors name the rank.
  absl::Status Start(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<const Device> device,
                     Backend backend = Backend::kAuto);
  // After Start: the engine (for callers that read it after or instead of Run).
  Engine& engine() { return *engine_; }
  // Resumes (if asked) and runs steps to the end, a stop_after, an error or a
  // Cancel (Cancelled, naming the step); the last save is committed before
  // it returns OK.
  absl::Status Run();
  // From any thread: Run returns Cancelled, before the next step or, when a
  // collective of this step waits, as soon as its communicator can end the
  // wait (Communicator::Abort): a job being stopped does not sit out the
  // collective timeout on a peer that failed.
  void Cancel();
  // Asks for a save after the next step (every rank saves after the first
  // step in which any rank asked).
  void RequestSave() { save_requested_ = true; }
  int64_t step() const { return step_; }  // steps done

 private:
  // Starts this rank's save of `step` (in the background with [checkpoint]
  // async); at most one save is in flight.
  absl::Status Save(int64_t step);
  absl::Status WaitForSave();
  bool WantsTimedSave() const;
  void AbortComms() ABSL_EXCLUSIVE_LOCKS_REQUIRED(comms_mu_);

  const JobRun run_;
  CheckpointSink* const sink_;
  const JobHooks hooks_;
  std::unique_ptr<Engine> engine_;
  std::atomic<bool> cancel_{false};
  // The engine's communicators, for Cancel to abort (set once the engine
  // owns them, and valid as long as it lives).
  absl::Mutex comms_mu_;
  std::vector<comm::Communicator*> comms_ ABSL_GUARDED_BY(comms_mu_);
  std::atomic<bool> save_requested_{false};
  std::atomic<int64_t> step_{0};
  absl::Time last_save_;          // the start of the run, or of the last save
  std::thread save_thread_;       // the async save in flight
  absl::Status save_status_;      // its outcome, read after joining
  std::atomic<bool> save_done_{false};
};

}  // namespace shardline
