// Scheduler: the queue and placement (see the header).
#include "server/scheduler.h"

#include <algorithm>
#include <utility>

namespace shardline {

void Scheduler::Enqueue(const std::string& id) { queue_.push_back({id}); }

void Scheduler::EnqueueFront(const std::string& id) {
  Remove(id);
  queue_.insert(queue_.begin(), {id});
}

void Scheduler::Remove(const std::string& id) {
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [&](const QueuedJob& q) { return q.id == id; }),
               queue_.end());
}

std::vector<std::string> Scheduler::Queued() const {
  std::vector<std::string> out;
  for (const QueuedJob& q : queue_) out.push_back(q.id);
  return out;
}

void Scheduler::Run(uint64_t registry_version, const TryStart& try_start) {
  for (size_t i = 0; i < queue_.size();) {
    if (queue_[i].too_few_at == registry_version) {
      ++i;  // as it was: too few registered
      continue;
    }
    ++start_attempts_;
    const std::string id = queue_[i].id;  // try_start may remove it
    switch (try_start(id)) {
      case StartOutcome::kStarted:
        Remove(id);
        break;
      case StartOutcome::kTooFewRegistered:
        queue_[i++].too_few_at = registry_version;  // the jobs behind it may start
        break;
      case StartOutcome::kWaitsForIdle:
        return;  // nobody overtakes it
    }
  }
}

Scheduler::Placement Scheduler::Place(WorkerRegistry::Census& census, int least, int want,
                                      const std::function<int(int lo, int hi)>& largest_world) {
  for (const char* kind : {"cuda", "cpu"}) {
    auto it = census.idle_by_kind.find(kind);
    if (it == census.idle_by_kind.end()) continue;
    const int world = largest_world(least, std::min<int>(want, it->second.size()));
    if (world > 0) return Placement{std::move(it->second), world};
  }
  return Placement{};
}

}  // namespace shardline
