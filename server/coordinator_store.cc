// CoordinatorCore's store calls: the service's Store* RPCs, each under the
// core's lock, passed to the RendezvousStore (server/rendezvous_store.h).
#include "server/coordinator_core.h"

namespace shardline {

absl::Status CoordinatorCore::AuthorizeStore(const std::string& credential,
                                             const std::vector<std::string>& keys) const {
  absl::MutexLock lock(&mu_);
  absl::Status s = rendezvous_.Authorize(credential, keys);
  if (!s.ok() && options_.events.refused) options_.events.refused("store");
  return s;
}

absl::Status CoordinatorCore::StoreSet(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  return rendezvous_.Set(key, value);
}

absl::StatusOr<std::string> CoordinatorCore::StoreGet(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  return rendezvous_.Get(key);
}

absl::StatusOr<int64_t> CoordinatorCore::StoreAdd(const std::string& key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  return rendezvous_.Add(key, delta);
}

bool CoordinatorCore::StoreCheck(const std::vector<std::string>& keys) const {
  absl::MutexLock lock(&mu_);
  return rendezvous_.Check(keys);
}

bool CoordinatorCore::StoreDelete(const std::string& key) {
  absl::MutexLock lock(&mu_);
  return rendezvous_.Delete(key);
}

void CoordinatorCore::Shutdown() {
  absl::MutexLock lock(&mu_);
  rendezvous_.Shutdown();
}

void CoordinatorCore::StoreWait(const std::vector<std::string>& keys, absl::Time deadline, DoneCallback done,
                                std::function<bool()> cancelled) {
  absl::MutexLock lock(&mu_);
  rendezvous_.Wait(keys, deadline, std::move(done), std::move(cancelled));
}

}  // namespace shardline
