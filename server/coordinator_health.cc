// Rank health: what heartbeats and progress say about each rank of a running
// job, its lag behind the job's fastest rank, and stall detection.
//
// Why time-based: in synchronous data parallelism no rank can be more than
// one collective ahead of the slowest (every collective needs every rank), so
// a hung rank shows as a job that stops moving, not as a large lag. The rank
// at fault is the one that stopped heartbeating (a paused or frozen process),
// else the one(s) behind on collectives (hung before entering the next one).
#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/coordinator_core.h"

namespace shardline {
namespace {

// What the job keeps of a rank's figure for strategy = "auto": only a
// finite one in (0, bound] counts (a worker is not trusted; 0 is a figure
// not measured, and the last attempt's stays); the first rank's of a
// rendezvous replaces the last attempt's, then the slowest rank's stays: the
// least (or where `most`, the greatest).
double Slowest(double kept, double reported, bool first, double bound, bool most) {
  const bool valid = reported > 0 && reported <= bound;  // (NaN is neither)
  if (!valid) return kept;
  if (first || kept <= 0) return reported;
  return most ? std::max(kept, reported) : std::min(kept, reported);
}

}  // namespace

void CoordinatorCore::RecordProgress(JobRecord& r, int rank, int64_t step, int64_t seq) {
  RankProgress& p = r.progress[rank];
  if (step != p.step || seq != p.seq || p.last_change == absl::Time()) {
    p.step = step;
    p.seq = seq;
    p.last_change = Now();
  }
}

void CoordinatorCore::OnConnected(const std::string& worker_id, const v1::RankConnected& c) {
  absl::MutexLock lock(&mu_);
  JobRecord* held = RankOfSession(worker_id, c.job_id(), c.rank(), "connected");
  if (!held) return;
  JobRecord& r = *held;
  const bool was_complete = static_cast<int>(r.connected_ranks.size()) == JobOf(r).workers();
  r.connected_ranks.insert(c.rank());
  RecordProgress(r, c.rank(), 0, 0);
  // The slowest rank's measurements bound the step: the next pick uses them.
  v1::Job& j = JobOf(r);
  const bool first = r.connected_ranks.size() == 1;
  j.set_measured_bus_bandwidth(Slowest(j.measured_bus_bandwidth(), c.bus_bandwidth(), first, 1e15, false));
  j.set_measured_compute_flops(Slowest(j.measured_compute_flops(), c.compute_flops(), first, 1e18, false));
  j.set_measured_comm_cpu_s_per_byte(
      Slowest(j.measured_comm_cpu_s_per_byte(), c.comm_cpu_s_per_byte(), first, 1, true));
  if (c.send_seconds_size() == JobOf(r).workers()) {
    std::vector<double> s(c.send_seconds().begin(), c.send_seconds().end());
    if (std::all_of(s.begin(), s.end(), [](double x) { return std::isfinite(x) && x >= 0; })) {
      r.send_seconds[c.rank()] = std::move(s);
    }
  }
  if (!was_complete && static_cast<int>(r.connected_ranks.size()) == JobOf(r).workers()) {
    FindSlowLink(r);
    if (options_.events.rendezvous_done) options_.events.rendezvous_done(Now() - r.started);
    PickAgainOnTheMeasuredLink(r);
  }
}

void CoordinatorCore::FindSlowLink(JobRecord& r) {
  v1::Job& j = JobOf(r);
  const int n = j.workers();
  if (n < 2 || static_cast<int>(r.send_seconds.size()) < n) return;
  // Per sending rank, the slowest any rank saw its broadcast take.
  std::vector<double> per_rank(n, 0);
  for (const auto& [reporter, seconds] : r.send_seconds) {
    for (int root = 0; root < n; ++root) per_rank[root] = std::max(per_rank[root], seconds[root]);
  }
  std::vector<double> sorted = per_rank;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[(n - 1) / 2];
  const int slowest = static_cast<int>(std::max_element(per_rank.begin(), per_rank.end()) - per_rank.begin());
  if (per_rank[slowest] < 3 * median || per_rank[slowest] < 0.05) return;
  r.slow_rank = slowest;
  j.set_straggler(absl::StrFormat("rank %d on host %s sends 1 MiB in %.2f s, the median rank in %.2f s", slowest,
                                  registry_.HostOf(j.worker_ids(slowest)), per_rank[slowest], median));
}

void CoordinatorCore::FillRanks(const JobRecord& r, absl::Time now, v1::Job* out) const {
  const v1::Job& j = r.stored.job;
  if (j.state() != v1::JOB_STATE_RUNNING) return;
  int64_t max_step = 0, max_seq = 0;
  for (const auto& [rank, p] : r.progress) {
    max_step = std::max(max_step, p.step);
    max_seq = std::max(max_seq, p.seq);
  }
  for (int rank = 0; rank < j.worker_ids_size(); ++rank) {
    v1::RankStatus* s = out->add_ranks();
    s->set_rank(rank);
    s->set_worker_id(j.worker_ids(rank));
    if (const WorkerRecord* w = registry_.Find(j.worker_ids(rank))) {
      s->set_host(w->info.host());
      s->set_heartbeat_age_seconds(absl::ToDoubleSeconds(now - w->last_heartbeat));
    }
    auto p = r.progress.find(rank);
    const RankProgress progress = p == r.progress.end() ? RankProgress{0, 0, r.started} : p->second;
    s->set_step(progress.step);
    s->set_last_collective_seq(progress.seq);
    s->set_lag_steps(max_step - progress.step);
    s->set_lag_collectives(max_seq - progress.seq);
    s->set_seconds_since_progress(absl::ToDoubleSeconds(now - progress.last_change));
    s->set_stalled(r.stalled_ranks.count(rank) > 0);
    s->set_slow_link(rank == r.slow_rank);
  }
}

void CoordinatorCore::UpdateStalls(absl::Time now) {
  for (const std::string& id : active_) {
    JobRecord& r = jobs_.at(id);
    v1::Job& j = JobOf(r);
    if (j.state() != v1::JOB_STATE_RUNNING) continue;
    absl::Time last_any = r.started;
    for (const auto& [rank, p] : r.progress) last_any = std::max(last_any, p.last_change);
    std::set<int> culprits;
    std::string why;
    if (now - last_any >= options_.stall_after) {
      // First suspects: ranks whose heartbeats stopped (twice the interval).
      std::vector<std::string> parts;
      for (int rank = 0; rank < j.worker_ids_size(); ++rank) {
        const WorkerRecord* w = registry_.Find(j.worker_ids(rank));
        if (w == nullptr) continue;
        const absl::Duration age = now - w->last_heartbeat;
        if (age > 2 * options_.heartbeat_interval) {
          culprits.insert(rank);
          parts.push_back(absl::StrFormat("rank %d on host %s sends no heartbeats", rank, w->info.host()));
        }
      }
      if (culprits.empty()) {
        std::vector<int64_t> seqs(j.workers(), 0);  // a rank not heard from is at 0
        for (const auto& [rank, p] : r.progress) {
          if (rank < j.workers()) seqs[rank] = p.seq;
        }
        const auto [lo_it, hi_it] = std::minmax_element(seqs.begin(), seqs.end());
        const int64_t lo = *lo_it, hi = *hi_it;
        for (int rank = 0; rank < j.workers(); ++rank) {
          if (lo == hi || seqs[rank] == lo) culprits.insert(rank);
        }
        if (lo == hi) {
          parts.push_back(absl::StrFormat("every rank waits after collective #%d", lo));
        } else {
          std::vector<int> behind(culprits.begin(), culprits.end());
          parts.push_back(absl::StrFormat("rank %s behind at collective #%d (others at #%d)",
                                          absl::StrJoin(behind, ","), lo, hi));
        }
      }
      why = absl::StrCat("no progress for over ", absl::FormatDuration(options_.stall_after), ": ",
                         absl::StrJoin(parts, "; "));
    }
    if (why != j.stalled() || culprits != r.stalled_ranks) {
      j.set_stalled(why);
      r.stalled_ranks = culprits;
      Notify(r);
    }
  }
}

}  // namespace shardline
