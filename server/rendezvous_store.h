// RendezvousStore: the key-value store a job's ranks rendezvous through
// (Gloo's store, NCCL's unique id), served by the coordinator as the
// Store* RPCs. A key's job is what precedes its first "/".
//
// Owns: the keys and their values, the pending waits, and the map from each
// running attempt's rank credentials to its job (who may touch which keys).
// WorkerChannel, jobs and the state database are none of its business:
// nothing here is persisted, and a restarted coordinator starts empty.
//
// Bounds, so that one job cannot starve another's rendezvous (refusals are
// ResourceExhausted naming the limit): keys of at most kMaxKeyBytes, values
// of at most kMaxValueBytes; per job kMaxJobBytes, kMaxJobKeys and
// kMaxJobWaiters pending waits; in all kMaxBytes, kMaxKeys and kMaxWaiters;
// waits of at most kMaxWaitKeys keys.
//
// Errors: InvalidArgument (an empty or overlong key), ResourceExhausted (a
// bound), NotFound (Get of an unset key), OutOfRange (an Add that would
// overflow), PermissionDenied (Authorize). A wait's DoneCallback gets OK
// with the values, DeadlineExceeded (ExpireWaits past its deadline),
// Cancelled (its caller gave up), Aborted (its job's attempt ended:
// DropJob), Unavailable (Shutdown) or ResourceExhausted (refused at once).
//
// Not thread-safe: CoordinatorCore calls it under its mutex. Every
// DoneCallback runs synchronously inside the call that answers it (Set, Add,
// Wait, ExpireWaits, DropJob, Shutdown), so it must be cheap and must not
// call back into the store or its owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardline {

class RendezvousStore {
 public:
  // A wait's outcome: OK with the values of the awaited keys, or an error.
  using DoneCallback = std::function<void(const absl::Status&, const std::vector<std::string>& values)>;

  static constexpr size_t kMaxKeyBytes = 512, kMaxValueBytes = 1 << 20;
  static constexpr size_t kMaxJobBytes = 8 << 20, kMaxJobKeys = 1 << 13, kMaxJobWaiters = 1024;
  static constexpr size_t kMaxBytes = 64 << 20, kMaxKeys = 1 << 16;
  static constexpr size_t kMaxWaitKeys = 256, kMaxWaiters = 4096;

  // The job a key belongs to: what precedes its first "/".
  static std::string JobOfKey(const std::string& key) { return key.substr(0, key.find('/')); }

  // ---- access ----
  // `credential` opens job `job_id`'s keys ("<job_id>/...") until revoked.
  void Grant(const std::string& credential, const std::string& job_id);
  void Revoke(const std::string& credential);
  // OK if `credential` was granted and every key lies under its job's
  // "<job>/"; PermissionDenied naming the key or the missing credential.
  // The caller counts refusals.
  absl::Status Authorize(const std::string& credential, const std::vector<std::string>& keys) const;

  // ---- keys ----
  absl::Status Set(const std::string& key, std::string value);
  absl::StatusOr<std::string> Get(const std::string& key) const;
  // A c10d counter: the key's value read as a decimal (0 when unset) plus
  // `delta`, stored back as a decimal.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  bool Check(const std::vector<std::string>& keys) const;  // every key is set
  bool Delete(const std::string& key);                      // false if unset

  // ---- waits ----
  // Calls done(OK, values) once every key is set (at once if they are), or
  // answers it later as the header says. After Shutdown, done(Unavailable)
  // at once.
  void Wait(const std::vector<std::string>& keys, absl::Time deadline, DoneCallback done,
            std::function<bool()> cancelled = nullptr);
  // Answers the waits past their deadline at `now`, and those whose
  // `cancelled` says so.
  void ExpireWaits(absl::Time now);

  // A job's attempt ended: its keys go (the next attempt's would collide
  // with them) and its pending waits are answered Aborted. Credentials are
  // revoked separately (Revoke).
  void DropJob(const std::string& job_id);
  // Answers every pending wait (Unavailable) and refuses new ones.
  void Shutdown();

  // What it holds, for tests and metrics.
  size_t keys() const { return kv_.size(); }
  size_t bytes() const { return kv_bytes_; }
  size_t waits() const { return waiters_.size(); }

 private:
  struct Waiter {
    std::vector<std::string> keys;
    absl::Time deadline;
    DoneCallback done;
    std::function<bool()> cancelled;  // the caller gave up (may be empty)
  };
  // One job's share of the bounds; dropped once it has no keys and no waits.
  struct JobUse {
    size_t bytes = 0, keys = 0, waiters = 0;
  };

  // Answers the waits whose keys are all set.
  void WakeWaiters();
  // Answers a wait and gives its place back to its job's count (the caller
  // then drops it from waiters_).
  void EndWait(Waiter& w, const absl::Status& s, const std::vector<std::string>& values);
  std::map<std::string, std::string>::iterator Erase(std::map<std::string, std::string>::iterator it);

  std::map<std::string, std::string> kv_;
  size_t kv_bytes_ = 0;               // keys and values of kv_
  std::map<std::string, JobUse> use_;  // by the keys' job
  std::vector<Waiter> waiters_;
  // The rank credentials of running attempts -> their job id.
  std::map<std::string, std::string> credential_jobs_;
  bool shutting_down_ = false;
};

}  // namespace shardline
