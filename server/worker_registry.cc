// WorkerRegistry: the connected workers (see the header).
#include "server/worker_registry.h"

#include <arpa/inet.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/quoted.h"
#include "common/job/device_spec.h"

namespace shardline {
namespace {

bool IsIpLiteral(const std::string& text) {
  unsigned char buf[16];
  return inet_pton(AF_INET, text.c_str(), buf) == 1 || inet_pton(AF_INET6, text.c_str(), buf) == 1;
}

// A registering worker's `field` is at most `max_bytes` and IsPrintable.
absl::Status CheckText(const char* field, const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes && IsPrintable(text)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("register: ", field, " ", Quoted(text), ": at most ", max_bytes, " bytes of printable text"));
}

}  // namespace

absl::Status WorkerRegistry::Check(const v1::WorkerInfo& info) {
  if (info.host().empty() || info.device().empty()) {
    return absl::InvalidArgumentError("register: a worker must name its host and device");
  }
  // Every string of a worker is listed to every user (`shardctl workers`,
  // `status`, job messages): bounded and printable where it enters, so no
  // worker can write to a user's terminal or grow a listing past a message.
  absl::Status text = CheckText("host", info.host(), kMaxHostBytes);
  if (text.ok()) text = CheckText("device", info.device(), kMaxDeviceBytes);
  if (text.ok()) text = CheckText("job_id", info.job_id(), kMaxDeviceBytes);
  if (text.ok() && info.capabilities_size() > kMaxCapabilities) {
    text = absl::InvalidArgumentError(absl::StrCat("register: more than ", kMaxCapabilities, " capabilities"));
  }
  for (const std::string& c : info.capabilities()) {
    if (text.ok()) text = CheckText("capability", c, kMaxDeviceBytes);
  }
  if (!text.ok()) return text;
  // Shown to every user and dialled by peers: an IP literal or nothing.
  if (!info.collective_address().empty() && !IsIpLiteral(info.collective_address())) {
    return absl::InvalidArgumentError(absl::StrCat("register: collective_address ", Quoted(info.collective_address()),
                                                   " is not an IP address"));
  }
  return absl::OkStatus();
}

std::string WorkerRegistry::Key(const v1::WorkerInfo& w) {
  return absl::StrCat(w.host(), "/", w.device(), w.collective_address().empty() ? "" : "@", w.collective_address());
}

WorkerRecord& WorkerRegistry::Add(v1::WorkerInfo info, WorkerChannel* channel, absl::Time now) {
  const std::string id = absl::StrFormat("w-%d", next_id_++);
  info.clear_claim_credential();
  info.set_worker_id(id);
  info.set_state(v1::WORKER_STATE_IDLE);
  info.clear_job_id();
  info.set_rank(0);
  ++version_;
  WorkerRecord& w = workers_[id];
  w.info = std::move(info);
  w.channel = channel;
  w.last_heartbeat = now;
  return w;
}

std::optional<v1::WorkerInfo> WorkerRegistry::Remove(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  v1::WorkerInfo info = std::move(it->second.info);
  workers_.erase(it);
  ++version_;
  return info;
}

WorkerRecord* WorkerRegistry::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerRecord* WorkerRegistry::Find(const std::string& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::string WorkerRegistry::HostOf(const std::string& id) const {
  const WorkerRecord* w = Find(id);
  return w ? w->info.host() : "?";
}

bool WorkerRegistry::Heard(const std::string& id, absl::Time now) {
  WorkerRecord* w = Find(id);
  if (w) w->last_heartbeat = now;
  return w != nullptr;
}

std::vector<std::string> WorkerRegistry::Silent(absl::Time now, absl::Duration lost_after) const {
  std::vector<std::string> out;
  for (const auto& [id, w] : workers_) {
    if (now - w.last_heartbeat > lost_after) out.push_back(id);
  }
  return out;
}

const WorkerRecord* WorkerRegistry::AnyOnJob(const std::string& job_id) const {
  for (const auto& [id, w] : workers_) {
    if (w.info.job_id() == job_id) return &w;
  }
  return nullptr;
}

void WorkerRegistry::Assign(WorkerRecord& w, const std::string& job_id, int rank) {
  w.info.set_state(v1::WORKER_STATE_BUSY);
  w.info.set_job_id(job_id);
  w.info.set_rank(rank);
}

void WorkerRegistry::Release(WorkerRecord& w) {
  w.info.set_state(v1::WORKER_STATE_IDLE);
  w.info.clear_job_id();
  w.info.set_rank(0);
  w.unproven_claim.clear();
}

WorkerRegistry::Census WorkerRegistry::Count(const std::set<std::string>& excluded) {
  Census c;
  for (auto& [id, w] : workers_) {
    const std::string kind = DeviceKindName(w.info.device());
    ++c.registered_by_kind[kind];
    if (w.info.state() == v1::WORKER_STATE_IDLE && !excluded.count(Key(w.info))) {
      c.idle_by_kind[kind].push_back(&w);
    }
  }
  return c;
}

int WorkerRegistry::IdleOfKind(const std::string& kind, const std::set<std::string>& excluded) const {
  int idle = 0;
  for (const auto& [id, w] : workers_) {
    if (w.info.state() == v1::WORKER_STATE_IDLE && DeviceKindName(w.info.device()) == kind &&
        !excluded.count(Key(w.info))) {
      ++idle;
    }
  }
  return idle;
}

std::vector<v1::WorkerInfo> WorkerRegistry::List(absl::Time now) const {
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_) {
    out.push_back(w.info);
    out.back().set_heartbeat_age_seconds(absl::ToDoubleSeconds(now - w.last_heartbeat));
  }
  return out;
}

}  // namespace shardline
