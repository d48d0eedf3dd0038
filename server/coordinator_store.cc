// The coordinator's rendezvous store (CoordinatorCore's store calls): the
// keys the engine's communicators bootstrap through, confined to each job's
// namespace and bounded in keys, bytes and waits.
#include "absl/strings/str_cat.h"
#include "server/coordinator_core.h"

namespace shardline {

void CoordinatorCore::WakeWaiters() {
  std::vector<Waiter> keep;
  for (Waiter& w : waiters_) {
    bool ready = true;
    for (const auto& k : w.keys) ready &= kv_.count(k) > 0;
    if (ready) {
      std::vector<std::string> values;
      for (const auto& k : w.keys) values.push_back(kv_.at(k));
      w.done(absl::OkStatus(), values);
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
  const size_t old = it == kv_.end() ? 0 : key.size() + it->second.size();
  if (it == kv_.end() && kv_.size() >= kMaxStoreKeys) {
    return absl::ResourceExhaustedError(absl::StrCat("store: ", kMaxStoreKeys, " keys are set, the limit"));
  }
  if (kv_bytes_ - old + key.size() + value.size() > kMaxStoreBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("store: setting ", key, " would pass the limit of ",
                                                     kMaxStoreBytes, " bytes for all keys"));
  }
  kv_bytes_ = kv_bytes_ - old + key.size() + value.size();
  kv_[key] = std::move(value);
  WakeWaiters();
  return absl::OkStatus();
}

std::map<std::string, std::string>::iterator CoordinatorCore::EraseKv(std::map<std::string, std::string>::iterator it) {
  kv_bytes_ -= it->first.size() + it->second.size();
  return kv_.erase(it);
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
            absl::StrCat("store: key \"", k.substr(0, 64), "\" is outside job ", it->second, "'s keys (", prefix, "...)"));
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
  for (Waiter& w : waiters_) w.done(absl::UnavailableError("the coordinator is shutting down"), {});
  waiters_.clear();
}

void CoordinatorCore::StoreWait(const std::vector<std::string>& keys, absl::Time deadline, DoneCallback done,
                                std::function<bool()> cancelled) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) {
    done(absl::UnavailableError("the coordinator is shutting down"), {});
    return;
  }
  if (keys.size() > kMaxWaitKeys || waiters_.size() >= kMaxStoreWaiters) {
    // Refused at once, as WakeWaiters answers waits (under the lock).
    done(absl::ResourceExhaustedError(absl::StrCat("store: a wait may name ", kMaxWaitKeys, " keys and ",
                                                   kMaxStoreWaiters, " waits may be pending")),
         {});
    return;
  }
  waiters_.push_back(Waiter{keys, deadline, std::move(done), std::move(cancelled)});
  WakeWaiters();
}

}  // namespace shardline
