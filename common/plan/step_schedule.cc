#include "common/plan/step_schedule.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <vector>

namespace shardline {
namespace {

// One link: collectives in issue order, one at a time.
class LinkQueue {
 public:
  LinkQueue(double bandwidth, ScheduleTimes* totals) : bandwidth_(bandwidth), totals_(totals) {}

  // Issues `bytes` at time `issued`; returns when they are all sent.
  // Moves everything queued `seconds` later (micro-batches left out).
  void Shift(double seconds) { free_at_ += seconds; }

  double Send(double issued, double bytes) {
    const double seconds = bytes / bandwidth_;
    free_at_ = std::max(issued, free_at_) + seconds;
    totals_->comm_s += seconds;
    totals_->bytes += bytes;
    return free_at_;
  }

 private:
  const double bandwidth_;
  double free_at_ = -std::numeric_limits<double>::infinity();  // (a carried gather starts before 0)
  ScheduleTimes* totals_;
};

struct Clock {
  double now = 0;  // the step thread's
  void WaitFor(double t) { now = std::max(now, t); }
};

// What the first block's forward gathers (units[1]): what the last backward
// did not keep gathered.
double FirstBlockGather(const ScheduleInput& in, bool first_micro) {
  return first_micro ? in.units[1].gather_bytes - in.first_block_frozen_bytes : 0;
}

// Forward of one micro-batch: each unit waits for its gather, then issues
// the gathers after it while fewer than the limit are in flight. Gathers are
// issued in unit order, so `next` (the first unit not yet issued) and the
// gathers past `u` are all the state there is: linear in the units.
// At the head (the last unit, whose loss is fused with its backward) the
// backward's first gathers are issued, as many as the limit allows, into
// `for_backward`. `gathered` holds the gathers issued before the step.
// `pieces`: unit -> when its pieces' gather across the replicas ends (the
// first micro-batch's gathers wait for it).
void Forward(const ScheduleInput& in, bool first_micro, LinkQueue& shard, LinkQueue& replica, Clock& clock,
             ScheduleTimes& out, std::map<int, double> gathered, std::map<int, double>* for_backward,
             const std::map<int, double>& pieces) {
  const int n = static_cast<int>(in.units.size());
  int next = 0;  // (gathered: unit -> when its gather ends)
  auto gather_bytes = [&](int u) { return u == 1 && n > 2 ? FirstBlockGather(in, first_micro) : in.units[u].gather_bytes; };
  auto issue = [&](int u) {
    if (gather_bytes(u) <= 0 || gathered.count(u)) return;
    const auto piece = pieces.find(u);
    const double after = first_micro && piece != pieces.end() ? piece->second : clock.now;
    gathered[u] = shard.Send(std::max(clock.now, after), gather_bytes(u));
  };
  for (int u = 0; u < n; ++u) {
    const UnitWork& w = in.units[u];
    if (w.replica_lookup_bytes > 0) clock.now = replica.Send(clock.now, w.replica_lookup_bytes);
    double early = 0;  // forward computed while the overlapped lookup is in flight
    if (w.overlapped_lookup_bytes > 0) {
      const double in_at = shard.Send(clock.now, w.overlapped_lookup_bytes);
      early = std::min(w.overlapped_lookup_s, w.forward_s);
      clock.now += early;
      clock.WaitFor(in_at);
    }
    const double lookup = w.lookup_bytes + (first_micro ? w.first_lookup_bytes : 0);
    if (lookup > 0) clock.now = shard.Send(clock.now, lookup);
    if (next <= u) issue(next++);
    if (auto it = gathered.find(u); it != gathered.end()) {
      clock.WaitFor(it->second);
      gathered.erase(gathered.begin(), std::next(it));  // (consumed)
    }
    int in_flight = static_cast<int>(gathered.size());
    for (; next < n && in_flight < in.max_inflight_gathers; ++next) {
      if (gather_bytes(next) > 0 && !gathered.count(next)) {
        issue(next);
        ++in_flight;
      }
    }
    for (int v = n - 2; u == n - 1 && v >= 0 && in_flight < in.max_inflight_gathers; --v) {
      if (in.units[v].gather_in_backward) {
        (*for_backward)[v] = shard.Send(clock.now, in.units[v].gather_bytes);
        ++in_flight;
      }
    }
    clock.now += w.forward_s - early;
    out.compute_s += w.forward_s;
  }
}

// Backward of one micro-batch, last unit first: a resharded unit is gathered
// again (the one before it prefetched), computed, then reduce-scattered; the
// replicas' all-reduce follows each reduce-scatter in the last micro-batch.
// The sparse lookup's rows (the embed unit's exchange) go out before the
// first block's reduce-scatter, unless they cross the replicas too
// (Engine::BackwardUnits).
void Backward(const ScheduleInput& in, bool last_micro, LinkQueue& shard, LinkQueue& replica, Clock& clock,
              ScheduleTimes& out, std::vector<double>* ends, std::map<int, double> gathered) {
  const int n = static_cast<int>(in.units.size());
  const bool reduce = last_micro || in.reduce_every_micro;
  const UnitWork& embed = in.units[0];
  const bool rows_first = n > 1 && embed.has_backward && embed.row_grad_bytes > 0 &&
                          !(embed.replica_row_grad_bytes > 0 && (last_micro || !embed.replica_rows_last_only));
  double previous_reduction = -1;
  auto reduce_unit = [&](const UnitWork& w) {
    double reduced = clock.now;
    if (w.reduce_bytes > 0) {
      reduced = shard.Send(clock.now, w.reduce_bytes);
      ends->push_back(reduced);
      if (in.reduce_every_micro && previous_reduction >= 0) clock.WaitFor(previous_reduction);
      previous_reduction = reduced;
    }
    if (last_micro && w.replica_bytes > 0) ends->push_back(replica.Send(reduced, w.replica_bytes));
  };
  for (int u = n - 1; u >= 0; --u) {
    const UnitWork& w = in.units[u];
    if (!w.has_backward) continue;
    if (w.gather_in_backward) {
      if (!gathered.count(u)) gathered[u] = shard.Send(clock.now, w.gather_bytes);
      clock.WaitFor(gathered[u]);
    }
    // The unit before is prefetched once this one is ready (BackwardPrefetch::kPre).
    if (u > 0 && in.units[u - 1].gather_in_backward && !gathered.count(u - 1)) {
      gathered[u - 1] = shard.Send(clock.now, in.units[u - 1].gather_bytes);
    }
    clock.now += w.backward_s;
    out.compute_s += w.backward_s;
    if (w.row_grad_bytes > 0) {
      const double rows = shard.Send(clock.now, w.row_grad_bytes);
      if (u == 0 && rows_first && reduce) reduce_unit(in.units[1]);  // (queued behind the rows)
      clock.WaitFor(rows);
    }
    if (w.replica_row_grad_bytes > 0 && (last_micro || !w.replica_rows_last_only)) {
      clock.now = replica.Send(clock.now, w.replica_row_grad_bytes);
    }
    if (reduce && !(u == 1 && rows_first)) reduce_unit(w);
  }
}

// One pass over the step's micro-batches.
ScheduleTimes Simulate(const ScheduleInput& in) {
  ScheduleTimes out;
  LinkQueue shard(in.shard_bw, &out), replica(in.replica_bw, &out);
  Clock clock;
  std::vector<double> ends;
  std::map<int, double> carried;  // the first block's, issued in the last step's update
  std::map<int, double> pieces;   // the updated pieces' gathers across the replicas
  const bool carry = in.carried_gather_s > 0 && in.units.size() > 2 && FirstBlockGather(in, true) > 0;
  // (The first block is updated first where its gather is carried.)
  std::vector<int> order;
  if (carry) order.push_back(1);
  for (int u = 0; u < static_cast<int>(in.units.size()); ++u) {
    if (!(carry && u == 1)) order.push_back(u);
  }
  for (int u : order) {
    if (in.units[u].replica_gather_bytes > 0) {
      pieces[u] = replica.Send(-in.carried_gather_s, in.units[u].replica_gather_bytes);
    }
  }
  if (carry) {
    const double after = pieces.count(1) ? std::max(pieces[1], -in.carried_gather_s) : -in.carried_gather_s;
    carried[1] = shard.Send(after, FirstBlockGather(in, true));
  }
  // Micro-batches between the first and the last repeat the second one's
  // timeline (the links drain the same way each time): simulated once and
  // counted as many times, so a batch of 2^24 costs three micro-batches.
  const int m = in.micro_batches;
  for (int k = 0; k < std::min(m, 3); ++k) {
    const ScheduleTimes before = out;
    const double start = clock.now;
    const bool last = k == std::min(m, 3) - 1;
    std::map<int, double> for_backward;
    Forward(in, k == 0, shard, replica, clock, out, k == 0 ? std::move(carried) : std::map<int, double>(),
            &for_backward, pieces);
    Backward(in, last, shard, replica, clock, out, &ends, std::move(for_backward));
    if (k == 1 && m > 3) {
      const double repeats = m - 3, seconds = (clock.now - start) * repeats;
      clock.now += seconds;
      shard.Shift(seconds);
      replica.Shift(seconds);
      out.compute_s += (out.compute_s - before.compute_s) * repeats;
      out.comm_s += (out.comm_s - before.comm_s) * repeats;
      out.bytes += (out.bytes - before.bytes) * repeats;
    }
  }
  for (double t : ends) clock.WaitFor(t);
  if (in.after_step_gather_bytes > 0) clock.now = shard.Send(clock.now, in.after_step_gather_bytes);
  out.step_s = clock.now;
  return out;
}

}  // namespace

ScheduleTimes SimulateStep(const ScheduleInput& in) {
  const ScheduleTimes first = Simulate(in);
  if (!(in.cpu_s_per_byte > 0) || !(first.compute_s > 0)) return first;
  // The bytes do not depend on the timeline: a second pass, every unit's
  // compute stretched by the CPU its step's sends take.
  ScheduleInput stretched = in;
  const double stretch = 1 + in.cpu_s_per_byte * first.bytes / first.compute_s;
  for (UnitWork& w : stretched.units) {
    w.forward_s *= stretch;
    w.backward_s *= stretch;
    w.overlapped_lookup_s *= stretch;
  }
  return Simulate(stretched);
}

}  // namespace shardline
