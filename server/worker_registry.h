// WorkerRegistry: the workers connected to the coordinator, one record per
// session: what each registered (host, device, memory, collective address),
// its session's channel, when it was last heard from, and which job and
// rank it holds.
//
// Owns: the records and the ids it gives them ("w-1", "w-2", ...; never
// reused by one coordinator), and a version that changes whenever a worker
// registers or leaves (the scheduler's cue that a job which had too few
// workers registered may fit now). A WorkerChannel is not owned: it stays
// valid until Remove of its worker.
//
// Errors: Check refuses (InvalidArgument naming the field) a worker without
// a host or device, with text that is too long or not printable, too many
// capabilities, or a collective address that is not an IP literal. Every
// other call succeeds; a lookup of an unknown id gives null or nullopt.
//
// Not thread-safe: CoordinatorCore calls it under its mutex. A pointer to a
// record stays valid until that worker is removed.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "shardline/v1/shardline.pb.h"

namespace shardline {

class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  virtual void Send(const v1::CoordinatorMessage& msg) = 0;
  // Ends the session (the worker will reconnect).
  virtual void Close(const absl::Status& why) = 0;
};

struct WorkerRecord {
  v1::WorkerInfo info;
  WorkerChannel* channel = nullptr;
  absl::Time last_heartbeat;
  // A job it said it still runs without proof (CoordinatorCore::
  // RegisterWorker): it is told to stop and is busy until it reports that
  // job finished, but no job waits on it and nothing of that job's is
  // refused for it.
  std::string unproven_claim;
};

class WorkerRegistry {
 public:
  // A host name is at most 253 bytes in DNS; a device, job id or capability is short.
  static constexpr size_t kMaxHostBytes = 255, kMaxDeviceBytes = 64;
  static constexpr int kMaxCapabilities = 16;

  // Whether a registering worker's info may enter: every string of a worker
  // is listed to every user, so it is bounded and printable.
  static absl::Status Check(const v1::WorkerInfo& info);
  // "host/device@address" (the address its collectives bind): a worker's
  // place, which outlives its session (a job's excluded workers are named by
  // it). The address tells apart two workers that give one --host name.
  static std::string Key(const v1::WorkerInfo& w);

  // Adds an idle worker under a fresh id (info.worker_id), heard from `now`.
  WorkerRecord& Add(v1::WorkerInfo info, WorkerChannel* channel, absl::Time now);
  // Removes a worker; its info as it was, or nullopt if there was none.
  std::optional<v1::WorkerInfo> Remove(const std::string& id);

  WorkerRecord* Find(const std::string& id);
  const WorkerRecord* Find(const std::string& id) const;
  // The host of worker `id`, or "?" once it is gone.
  std::string HostOf(const std::string& id) const;
  // Heard from at `now` (a heartbeat, progress). False if there is no such worker.
  bool Heard(const std::string& id, absl::Time now);
  // The workers not heard from for more than `lost_after` at `now`, by id.
  std::vector<std::string> Silent(absl::Time now, absl::Duration lost_after) const;
  // A worker (the first by id) that holds job `job_id` (a rank of it, or an
  // earlier attempt it is stopping); null if none does.
  const WorkerRecord* AnyOnJob(const std::string& job_id) const;

  // The session holds `rank` of `job_id`: busy with it.
  static void Assign(WorkerRecord& w, const std::string& job_id, int rank);
  // The session holds no job (and no unproven claim): idle.
  static void Release(WorkerRecord& w);

  // Who could take a job: the idle workers by device kind ("cuda", "cpu"),
  // but those whose Key is in `excluded`, and how many of each kind are
  // registered at all (idle or not).
  struct Census {
    std::map<std::string, std::vector<WorkerRecord*>> idle_by_kind;
    std::map<std::string, int> registered_by_kind;
  };
  Census Count(const std::set<std::string>& excluded);
  // Idle workers of device kind `kind`, but those in `excluded`.
  int IdleOfKind(const std::string& kind, const std::set<std::string>& excluded) const;

  // Every worker's info with its heartbeat age at `now`, by id.
  std::vector<v1::WorkerInfo> List(absl::Time now) const;
  size_t size() const { return workers_.size(); }
  uint64_t version() const { return version_; }

 private:
  std::map<std::string, WorkerRecord> workers_;  // by id
  uint64_t version_ = 1;                         // bumped as workers register and leave
  int next_id_ = 1;
};

}  // namespace shardline
