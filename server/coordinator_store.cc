// The coordinator's rendezvous store (CoordinatorCore's store calls): the
// keys the engine's communicators bootstrap through, confined to each job's
// namespace and bounded in keys, bytes and waits.
#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"
#include "server/coordinator_core.h"

namespace shardline {
namespace {
// The job a key belongs to: what precedes its first "/" (AuthorizeStore
// confines every caller to "<its job id>/").
std::string JobOfKey(const std::string& key) { return key.substr(0, key.find('/')); }
}  // namespace

void CoordinatorCore::WakeWaiters() {
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

absl::Status CoordinatorCore::PutKv(const std::string& key, std::string value) {
  if (key.empty() || key.size() > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store: a key must have 1 to ", kMaxStoreKeyBytes, " bytes"));
  }
  if (value.size() > kMaxStoreValueBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("store: the value of ", key, " has ", value.size(),
                                                     " bytes, more than the limit of ", kMaxStoreValueBytes));
  }
  auto it = kv_.find(key);
  const std::string job = JobOfKey(key);
  JobKv& mine = job_kv_[job];
  const size_t old = it == kv_.end() ? 0 : key.size() + it->second.size();
  const size_t added = key.size() + value.size();
  absl::Status refused;
  if (it == kv_.end() && (kv_.size() >= kMaxStoreKeys || mine.keys >= kMaxJobStoreKeys)) {
    refused = absl::ResourceExhaustedError(absl::StrCat("store: ", mine.keys >= kMaxJobStoreKeys ? job : "all jobs",
                                                        " already set the limit of ",
                                                        mine.keys >= kMaxJobStoreKeys ? kMaxJobStoreKeys : kMaxStoreKeys,
                                                        " keys"));
  } else if (mine.bytes - old + added > kMaxJobStoreBytes) {
    refused = absl::ResourceExhaustedError(absl::StrCat("store: setting ", key, " would pass the limit of ",
                                                        kMaxJobStoreBytes, " bytes for ", job, "'s keys"));
  } else if (kv_bytes_ - old + added > kMaxStoreBytes) {
    refused = absl::ResourceExhaustedError(absl::StrCat("store: setting ", key, " would pass the limit of ",
                                                        kMaxStoreBytes, " bytes for all keys"));
  }
  if (!refused.ok()) {
    if (mine.keys == 0 && mine.waiters == 0) job_kv_.erase(job);
    return refused;
  }
  kv_bytes_ = kv_bytes_ - old + added;
  mine.bytes = mine.bytes - old + added;
  if (it == kv_.end()) ++mine.keys;
  kv_[key] = std::move(value);
  WakeWaiters();
  return absl::OkStatus();
}

std::map<std::string, std::string>::iterator CoordinatorCore::EraseKv(std::map<std::string, std::string>::iterator it) {
  const size_t bytes = it->first.size() + it->second.size();
  kv_bytes_ -= bytes;
  auto job = job_kv_.find(JobOfKey(it->first));
  if (job != job_kv_.end()) {
    job->second.bytes -= bytes;
    --job->second.keys;
    if (job->second.keys == 0 && job->second.waiters == 0) job_kv_.erase(job);
  }
  return kv_.erase(it);
}

void CoordinatorCore::EndWait(Waiter& w, const absl::Status& s, const std::vector<std::string>& values) {
  w.done(s, values);
  if (w.keys.empty()) return;
  auto job = job_kv_.find(JobOfKey(w.keys[0]));
  if (job == job_kv_.end()) return;
  --job->second.waiters;
  if (job->second.keys == 0 && job->second.waiters == 0) job_kv_.erase(job);
}

absl::Status CoordinatorCore::AuthorizeStore(const std::string& credential,
                                             const std::vector<std::string>& keys) const {
  absl::MutexLock lock(&mu_);
  auto it = credential.empty() ? credential_jobs_.end() : credential_jobs_.find(credential);
  absl::Status refused;
  if (it == credential_jobs_.end()) {
    refused = absl::PermissionDeniedError("store: the call carries no credential of a running job's rank");
  } else {
    const std::string prefix = it->second + "/";
    for (const std::string& k : keys) {
      if (k.rfind(prefix, 0) != 0) {
        refused = absl::PermissionDeniedError(
            absl::StrCat("store: key ", Quoted(k), " is outside job ", it->second, "'s keys (", prefix, "...)"));
        break;
      }
    }
  }
  if (!refused.ok() && options_.events.refused) options_.events.refused("store");
  return refused;
}

absl::Status CoordinatorCore::StoreSet(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  return PutKv(key, value);
}

absl::StatusOr<std::string> CoordinatorCore::StoreGet(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) return absl::NotFoundError(absl::StrCat("store: no key ", key));
  return it->second;
}

absl::StatusOr<int64_t> CoordinatorCore::StoreAdd(const std::string& key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  // c10d stores keep counters as decimal strings.
  int64_t v = 0;
  auto it = kv_.find(key);
  if (it != kv_.end()) v = std::strtoll(it->second.c_str(), nullptr, 10);
  if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta)) {
    return absl::OutOfRangeError(absl::StrCat("store: adding ", delta, " to ", key, " overflows"));
  }
  v += delta;
  absl::Status s = PutKv(key, std::to_string(v));
  if (!s.ok()) return s;
  return v;
}

bool CoordinatorCore::StoreCheck(const std::vector<std::string>& keys) const {
  absl::MutexLock lock(&mu_);
  for (const auto& k : keys) {
    if (!kv_.count(k)) return false;
  }
  return true;
}

bool CoordinatorCore::StoreDelete(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  EraseKv(it);
  return true;
}

void CoordinatorCore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (Waiter& w : waiters_) EndWait(w, absl::UnavailableError("the coordinator is shutting down"), {});
  waiters_.clear();
}

void CoordinatorCore::StoreWait(const std::vector<std::string>& keys, absl::Time deadline, DoneCallback done,
                                std::function<bool()> cancelled) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) {
    done(absl::UnavailableError("the coordinator is shutting down"), {});
    return;
  }
  const std::string job = keys.empty() ? "" : JobOfKey(keys[0]);
  auto pending = job_kv_.find(job);
  if (keys.size() > kMaxWaitKeys || waiters_.size() >= kMaxStoreWaiters ||
      (pending != job_kv_.end() && pending->second.waiters >= kMaxJobWaiters)) {
    // Refused at once, as WakeWaiters answers waits (under the lock).
    done(absl::ResourceExhaustedError(absl::StrCat("store: a wait may name ", kMaxWaitKeys, " keys, and ",
                                                   kMaxJobWaiters, " waits of a job and ", kMaxStoreWaiters,
                                                   " in all may be pending")),
         {});
    return;
  }
  if (!keys.empty()) ++job_kv_[job].waiters;
  waiters_.push_back(Waiter{keys, deadline, std::move(done), std::move(cancelled)});
  WakeWaiters();
}

}  // namespace shardline
