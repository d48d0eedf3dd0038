// Scheduler: the queue of jobs waiting to start (PENDING or RESTARTING) and
// where a job fits (placement). What starting a job means (ranks,
// credentials, the state machine) is CoordinatorCore's.
//
// Queue policy: first come, first served, restarting jobs first (Enqueue
// Front), with one exception: a job that asks for more workers of one device
// kind than are registered at all does not hold the queue (it would wait for
// workers that may never come, as Slurm's backfill lets smaller jobs pass a
// job that cannot start). Such a job is passed over with one comparison
// until the worker registry's version changes, so an event costs a
// comparison per such job, not a look at it. A job that waits for idle
// workers holds everything behind it.
//
// Placement: a job's ranks share one device kind (NCCL and Gloo ranks cannot
// form one group); CUDA is preferred where enough of both are idle. The
// world size is the largest in [least, want] the idle workers of that kind
// and the job's config allow.
//
// Owns the queue (job ids, each at most once) and the count of looks at
// queued jobs. No errors. Not thread-safe: CoordinatorCore calls it under
// its mutex; the callbacks run synchronously and may Remove the job they
// were given, but must not otherwise change the queue.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "server/worker_registry.h"

namespace shardline {

class Scheduler {
 public:
  enum class StartOutcome { kStarted, kWaitsForIdle, kTooFewRegistered };
  // Tries to start queued job `id`; kStarted takes it off the queue.
  using TryStart = std::function<StartOutcome(const std::string& id)>;

  void Enqueue(const std::string& id);       // at the back
  void EnqueueFront(const std::string& id);  // ahead of every job (a restart), moved if queued
  void Remove(const std::string& id);        // no-op if not queued
  size_t size() const { return queue_.size(); }
  // The queued ids in the order they start.
  std::vector<std::string> Queued() const;

  // Walks the queue in order, calling `try_start` for each job but those
  // known to have too few workers registered at `registry_version`, and
  // stops at the first job that waits for idle workers.
  void Run(uint64_t registry_version, const TryStart& try_start);
  // How many times a queued job was looked at (try_start called): what
  // scheduling costs, for tests.
  int64_t start_attempts() const { return start_attempts_; }

  // Where a job of `want` workers, content with `least`, starts among the
  // idle workers of `census`: every idle worker of the chosen kind (at
  // least `world`, unsorted; moved out of the census) and the world size;
  // world 0 and no workers if it does not fit.
  // largest_world(lo, hi): the largest world size in [lo, hi] the job's
  // config allows, 0 if none.
  struct Placement {
    std::vector<WorkerRecord*> workers;
    int world = 0;
  };
  static Placement Place(WorkerRegistry::Census& census, int least, int want,
                         const std::function<int(int lo, int hi)>& largest_world);

 private:
  // `too_few_at`: the registry version at which the job last had fewer
  // workers registered than it needs (0: not known).
  struct QueuedJob {
    std::string id;
    uint64_t too_few_at = 0;
  };
  std::vector<QueuedJob> queue_;
  int64_t start_attempts_ = 0;
};

}  // namespace shardline
