// The rendezvous store: keys confined to each job's namespace and bounded in
// keys, bytes and waits (see the header).
#include "server/rendezvous_store.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"

namespace shardline {

void RendezvousStore::Grant(const std::string& credential, const std::string& job_id) {
  credential_jobs_[credential] = job_id;
}

void RendezvousStore::Revoke(const std::string& credential) { credential_jobs_.erase(credential); }

absl::Status RendezvousStore::Authorize(const std::string& credential, const std::vector<std::string>& keys) const {
  auto it = credential.empty() ? credential_jobs_.end() : credential_jobs_.find(credential);
  if (it == credential_jobs_.end()) {
    return absl::PermissionDeniedError("store: the call carries no credential of a running job's rank");
  }
  const std::string prefix = it->second + "/";
  for (const std::string& k : keys) {
    if (k.rfind(prefix, 0) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("store: key ", Quoted(k), " is outside job ", it->second, "'s keys (", prefix, "...)"));
    }
  }
  return absl::OkStatus();
}

void RendezvousStore::WakeWaiters() {
  std::vector<Waiter> keep;
  for (Waiter& w : waiters_) {
    bool ready = true;
    for (const auto& k : w.keys) ready &= kv_.count(k) > 0;
    if (ready) {
      std::vector<std::string> values;
      for (const auto& k : w.keys) values.push_back(kv_.at(k));
      EndWait(w, absl::OkStatus(), values);
    } else {
      keep.push_back(std::move(w));
    }
  }
  waiters_ = std::move(keep);
}

absl::Status RendezvousStore::Set(const std::string& key, std::string value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store: a key must have 1 to ", kMaxKeyBytes, " bytes"));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("store: the value of ", key, " has ", value.size(),
                                                     " bytes, more than the limit of ", kMaxValueBytes));
  }
  auto it = kv_.find(key);
  const std::string job = JobOfKey(key);
  JobUse& mine = use_[job];
  const size_t old = it == kv_.end() ? 0 : key.size() + it->second.size();
  const size_t added = key.size() + value.size();
  absl::Status refused;
  if (it == kv_.end() && (kv_.size() >= kMaxKeys || mine.keys >= kMaxJobKeys)) {
    refused = absl::ResourceExhaustedError(absl::StrCat("store: ", mine.keys >= kMaxJobKeys ? job : "all jobs",
                                                        " already set the limit of ",
                                                        mine.keys >= kMaxJobKeys ? kMaxJobKeys : kMaxKeys, " keys"));
  } else if (mine.bytes - old + added > kMaxJobBytes) {
    refused = absl::ResourceExhaustedError(absl::StrCat("store: setting ", key, " would pass the limit of ",
                                                        kMaxJobBytes, " bytes for ", job, "'s keys"));
  } else if (kv_bytes_ - old + added > kMaxBytes) {
    refused = absl::ResourceExhaustedError(
        absl::StrCat("store: setting ", key, " would pass the limit of ", kMaxBytes, " bytes for all keys"));
  }
  if (!refused.ok()) {
    if (mine.keys == 0 && mine.waiters == 0) use_.erase(job);
    return refused;
  }
  kv_bytes_ = kv_bytes_ - old + added;
  mine.bytes = mine.bytes - old + added;
  if (it == kv_.end()) ++mine.keys;
  kv_[key] = std::move(value);
  WakeWaiters();
  return absl::OkStatus();
}

std::map<std::string, std::string>::iterator RendezvousStore::Erase(std::map<std::string, std::string>::iterator it) {
  const size_t bytes = it->first.size() + it->second.size();
  kv_bytes_ -= bytes;
  auto job = use_.find(JobOfKey(it->first));
  if (job != use_.end()) {
    job->second.bytes -= bytes;
    --job->second.keys;
    if (job->second.keys == 0 && job->second.waiters == 0) use_.erase(job);
  }
  return kv_.erase(it);
}

void RendezvousStore::EndWait(Waiter& w, const absl::Status& s, const std::vector<std::string>& values) {
  w.done(s, values);
  if (w.keys.empty()) return;
  auto job = use_.find(JobOfKey(w.keys[0]));
  if (job == use_.end()) return;
  --job->second.waiters;
  if (job->second.keys == 0 && job->second.waiters == 0) use_.erase(job);
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) return absl::NotFoundError(absl::StrCat("store: no key ", key));
  return it->second;
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& key, int64_t delta) {
  // c10d stores keep counters as decimal strings.
  int64_t v = 0;
  auto it = kv_.find(key);
  if (it != kv_.end()) v = std::strtoll(it->second.c_str(), nullptr, 10);
  if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta)) {
    return absl::OutOfRangeError(absl::StrCat("store: adding ", delta, " to ", key, " overflows"));
  }
  v += delta;
  absl::Status s = Set(key, std::to_string(v));
  if (!s.ok()) return s;
  return v;
}

bool RendezvousStore::Check(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!kv_.count(k)) return false;
  }
  return true;
}

bool RendezvousStore::Delete(const std::string& key) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  Erase(it);
  return true;
}

void RendezvousStore::Wait(const std::vector<std::string>& keys, absl::Time deadline, DoneCallback done,
                           std::function<bool()> cancelled) {
  if (shutting_down_) {
    done(absl::UnavailableError("the coordinator is shutting down"), {});
    return;
  }
  const std::string job = keys.empty() ? "" : JobOfKey(keys[0]);
  auto pending = use_.find(job);
  if (keys.size() > kMaxWaitKeys || waiters_.size() >= kMaxWaiters ||
      (pending != use_.end() && pending->second.waiters >= kMaxJobWaiters)) {
    // Refused at once, as WakeWaiters answers waits.
    done(absl::ResourceExhaustedError(absl::StrCat("store: a wait may name ", kMaxWaitKeys, " keys, and ",
                                                   kMaxJobWaiters, " waits of a job and ", kMaxWaiters,
                                                   " in all may be pending")),
         {});
    return;
  }
  if (!keys.empty()) ++use_[job].waiters;
  waiters_.push_back(Waiter{keys, deadline, std::move(done), std::move(cancelled)});
  WakeWaiters();
}

void RendezvousStore::ExpireWaits(absl::Time now) {
  std::vector<Waiter> keep;
  for (Waiter& w : waiters_) {
    if (now >= w.deadline) {
      EndWait(w,
              absl::DeadlineExceededError(
                  absl::StrCat("store wait for ", w.keys.empty() ? "" : w.keys[0], " timed out")),
              {});
    } else if (w.cancelled && w.cancelled()) {
      EndWait(w, absl::CancelledError("store wait: the caller cancelled"), {});
    } else {
      keep.push_back(std::move(w));
    }
  }
  waiters_ = std::move(keep);
}

void RendezvousStore::DropJob(const std::string& job_id) {
  const std::string prefix = job_id + "/";
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;) it = Erase(it);
  // Its ranks still in rendezvous stop now, not at their wait's deadline
  // (a restart waits for them).
  std::vector<Waiter> keep;
  for (Waiter& w : waiters_) {
    if (!w.keys.empty() && w.keys[0].rfind(prefix, 0) == 0) {
      EndWait(w, absl::AbortedError(absl::StrCat("store: ", job_id, "'s attempt ended")), {});
    } else {
      keep.push_back(std::move(w));
    }
  }
  waiters_ = std::move(keep);
}

void RendezvousStore::Shutdown() {
  shutting_down_ = true;
  for (Waiter& w : waiters_) EndWait(w, absl::UnavailableError("the coordinator is shutting down"), {});
  waiters_.clear();
}

}  // namespace shardline
