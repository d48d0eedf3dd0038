// Communicator: the collectives one shard group (or replicate group) needs,
// over whichever backend runs (Gloo on CPU ranks, NCCL on GPU ranks). Nothing
// above comm/ knows which backend it talks to.
//
// Every collective is split-phase: the call starts it and returns a Work at
// once. Calls are executed in the order they are made, and every rank of the
// group must make the same calls in the same order (as with NCCL and Gloo).
//
// Devices and streams (docs/design.md): a collective sees every kernel the caller
// issued on its compute stream (the stream current on the calling thread)
// before the call. Work::WaitOnDevice orders the compute stream after the
// collective without blocking the host where the backend completes on the
// device (NCCL); Work::Wait blocks the host. Host-side backends (Gloo, the
// group of one) complete on the host, so for them both waits are host waits;
// Gloo stages CUDA tensors through host memory.
//
// Buffers: the tensors passed in must stay alive, and must not be touched by
// the caller, until a wait returned OK (for a device wait: the caller's later
// kernels on the compute stream are ordered after the op; freeing a buffer
// after WaitOnDevice is safe because the caching allocator hands its memory
// only to work ordered after the free on that stream). All tensors are 1-D,
// contiguous and on one device.
//
// Errors: a collective that cannot complete (a peer died, a peer hung past
// the op deadline) fails with a Status whose message starts with "[rank N]"
// and names the op, its sequence number and, where known, the peer. After any
// failure the communicator is aborted: every later call fails at once. An
// aborted communicator is never reused; the job is torn down instead.
//
// Thread safety: calls may come from one thread at a time; Work::Wait and
// Stats may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/ring_bytes.h"  // RingAllGatherBytes and the other byte counts

namespace shardline::comm {

enum class Op { kAllGather = 0, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
constexpr int kNumOps = 5;
const char* OpName(Op op);

// Per op kind: how many, how many bytes this rank sent, how long the
// collective ran from the moment the backend started it until it finished.
struct OpStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  double seconds = 0;
};
struct CommStats {
  std::array<OpStats, kNumOps> ops{};
  int64_t last_completed_seq = 0;  // sequence number of the last finished op
  const OpStats& of(Op op) const { return ops[static_cast<int>(op)]; }
};

// Lifetime: a Work may outlive its communicator; it then reports what it
// knew (an op not finished by then fails with Aborted).
class Work {
 public:
  virtual ~Work() = default;
  // Host wait: blocks until the op finished (its status) or `timeout` passed
  // (DeadlineExceeded naming the op; the communicator is then aborted). On
  // success the caller's compute stream is also ordered after the op.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Device wait: the caller's compute stream waits for the op; the host does
  // not, where the backend completes on the device (the communicator's
  // watchdog then bounds the op by its own op timeout, aborts it, and reports
  // the failure through Communicator::status() and every later call).
  // Elsewhere this is Wait(timeout). Returns any failure already known.
  virtual absl::Status WaitOnDevice(absl::Duration timeout) = 0;
  virtual bool Done() const = 0;
};

// A Work that finished at its call (an op with no peer to wait for).
std::shared_ptr<Work> CompletedWork();

// Told of every finished collective, on the thread that saw it finish (the
// communicator's own thread for Gloo, the waiting thread for NCCL). Must be
// cheap and thread-safe: the worker's metrics and heartbeats implement it.
class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  virtual void OnCollective(Op op, int64_t bytes_sent, double seconds, int64_t seq, bool ok) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  // Set before the first collective is issued (not synchronised with them).
  void set_observer(std::shared_ptr<CollectiveObserver> observer) { observer_ = std::move(observer); }
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // True where ops complete in issue order on the device (NCCL: one stream
  // per role, shared by every communicator of a rank; groups.cc). There an
  // op that reads another's result is issued right after it, never after a
  // host test of Done(): that test's answer depends on timing, so ranks
  // would issue ops of two communicators in different orders onto one
  // stream, and wait on each other for good.
  virtual bool ordered_on_device() const { return false; }

  // out[size * n] <- concatenation of every rank's in[n], in rank order.
  virtual std::shared_ptr<Work> AllGather(at::Tensor out, at::Tensor in) = 0;
  // out[n] <- sum over ranks of chunk `rank` of in[size * n]. `in` is scratch:
  // its contents are undefined afterwards. `out` may alias in's own chunk.
  virtual std::shared_ptr<Work> ReduceScatter(at::Tensor out, at::Tensor in) = 0;
  // inout <- sum over ranks of inout (any length; padded internally).
  virtual std::shared_ptr<Work> AllReduce(at::Tensor inout) = 0;
  // The op, queued now (in this call's order among this communicator's ops)
  // but run once `after`, an op of another communicator that writes its
  // input, has finished: the caller need not wait for `after` to issue it.
  // A failed `after` fails this op; a null `after` makes it the plain op. Where ops are ordered on the device
  // (NCCL) that order is the call's: these are the plain ops. A group of
  // one runs the op (a copy) when its Work is waited for, after `after`.
  virtual std::shared_ptr<Work> AllReduceAfter(at::Tensor inout, std::shared_ptr<Work> after) {
    (void)after;
    return AllReduce(std::move(inout));
  }
  virtual std::shared_ptr<Work> AllGatherAfter(at::Tensor out, at::Tensor in, std::shared_ptr<Work> after) {
    (void)after;
    return AllGather(std::move(out), std::move(in));
  }
  virtual std::shared_ptr<Work> ReduceScatterAfter(at::Tensor out, at::Tensor in, std::shared_ptr<Work> after) {
    (void)after;
    return ReduceScatter(std::move(out), std::move(in));
  }
  virtual std::shared_ptr<Work> Broadcast(at::Tensor inout, int root) = 0;
  virtual std::shared_ptr<Work> Barrier() = 0;

  virtual CommStats Stats() const = 0;
  // OK until the communicator aborted; then the failure that aborted it
  // ("[rank N] op #seq ..."). Device-side backends fail asynchronously, so
  // the engine checks this after each host synchronisation.
  virtual absl::Status status() const = 0;
  // From any thread: aborts the communicator with `why` (status() says it
  // from then on), fails every later op at once and ends the wait of the op
  // in progress as soon as the backend can: NCCL at once (ncclCommAbort);
  // Gloo at once in a ring step (all-gather, reduce-scatter, barrier, a small
  // all-reduce), and by the deadline in Gloo's own large all-reduce and
  // broadcast. For a job being
  // stopped: a peer that failed can leave this rank waiting on a connection
  // that stays open, and a rank must not sit out the collective timeout then.
  virtual void Abort(const absl::Status& why) = 0;

 protected:
  void Notify(Op op, int64_t bytes_sent, double seconds, int64_t seq, bool ok) const {
    if (observer_) observer_->OnCollective(op, bytes_sent, seconds, seq, ok);
  }

 private:
  std::shared_ptr<CollectiveObserver> observer_;
};

// Which link an op failed on, where the backend knows it: job rank `from`
// sent nothing that job rank `to` received (a recv that timed out), or `to`
// could not be reached from `from` (a send that failed), in the op of
// sequence number `seq`, at step `step` of its ring. Carried as a payload of
// the op's Status, so it survives being returned up the stack (not being
// rewrapped into a new Status). In a ring that stalls every rank times out
// waiting for its left neighbour; the broken link is the one of the lowest
// (seq, step): the others waited on ranks that were themselves waiting.
struct LinkFault {
  int from = -1, to = -1;
  int64_t seq = 0;
  int step = 0;
};
absl::Status WithLinkFault(absl::Status s, const LinkFault& f);
std::optional<LinkFault> LinkFaultOf(const absl::Status& s);

// A group of one: every collective completes at once and moves nothing.
// Its all-gather and reduce-scatter copy `in` to `out`, casting where their
// dtypes differ (every other communicator needs them equal).
std::unique_ptr<Communicator> CreateSelfCommunicator();

}  // namespace shardline::comm
