// Internal to worker/comm: the NCCL communicator's shared state and its
// watchdog, used by nccl_communicator.cc only. Not part of any public
// interface; the contract callers see is in nccl_communicator.h.
//
// The shape:
//
//   launching thread  (NcclCommunicator::Launch) builds an OpRecord, enqueues
//                     the timed NCCL call, then Register()s the record as
//                     outstanding, or FailUnregistered() if the launch failed.
//   watchdog          State::Watch polls the outstanding records: an end event
//                     that completed is accounted (stats, observer) and its
//                     record marked done; a late op, an NCCL async error or a
//                     CUDA error fails the communicator (State::Fail).
//   State::Fail       first failure wins: abort the NCCL communicator once,
//                     fail every outstanding record, tell the observer.
//
// Ownership. State holds the NCCL handle from construction and ends it
// exactly once: Fail() aborts it, or else its owner's CloseComm() finalizes
// and destroys it (State's destructor does neither); it is never touched
// after that. Records and State are shared (shared_ptr) with the Works, so a
// Work never dangles, even one that outlives its communicator. An OpRecord
// owns its two CUDA events, and holds the op's tensors (`stash`) until the op
// is done or a wait ordered the compute stream after it (Unstash).
//
// Threads. The communicator's launching thread, the watchdog (Watch, Poll)
// and any thread waiting on a Work call into State concurrently; every method
// takes the locks it needs. The observer (SetNotify) is called one call at a
// time, from the watchdog or from the thread that saw the failure.
//
// Locks. NcclCommunicator::launch_mu_ (one launch at a time) is taken first;
// State's three are never held together: mu_ guards the bookkeeping, comm_mu_
// the NCCL handle (no NCCL call on it may race ncclCommAbort), notify_mu_ the
// way to the observer (held while it runs, so its calls never overlap; it may
// call Stats(), which takes mu_). WithComm's `fn` runs under comm_mu_, so it
// must not call back into State.
//
// Errors. Every CUDA and NCCL return code becomes an absl::Status via
// CudaStatus and NcclStatus: Unavailable for NCCL's remote and system errors,
// Internal for other NCCL errors and every CUDA error; the watchdog reports a
// late op as DeadlineExceeded. Messages start with `where`: an op's label
// "[rank N] <op> #<seq>" or another "[rank N] ..." context. The first failure
// becomes status(); every op outstanding then fails with the same code,
// naming itself and the original failure.
//
// Only built where SHARDLINE_WITH_CUDA is defined.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl_communicator.h"

namespace shardline::comm::nccl_internal {

// How often the watchdog polls while ops are outstanding.
inline constexpr absl::Duration kPollInterval = absl::Milliseconds(1);

// "[rank N] ": the start of every message.
std::string RankPrefix(int rank);

// `where` is "[rank N] op #seq" or "[rank N] ...". The failed call's error is
// cleared from the thread's CUDA state, so that LibTorch's next launch check
// on this thread does not report it a second time (sticky errors stay).
absl::Status CudaStatus(const std::string& where, const char* call, cudaError_t e);

// Unavailable for ncclRemoteError and ncclSystemError, Internal otherwise;
// appends ncclGetLastError(comm) when it says anything (`comm` may be null).
absl::Status NcclStatus(const std::string& where, const char* call, ncclResult_t r, ncclComm_t comm);

// Sets the current device for a scope and restores the caller's afterwards.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard();

  absl::Status Set(int device, const std::string& where);

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// One launched collective. The immutable part is set before the record is
// shared; `phase`, `status` and `stash` are guarded by State::mu.
struct OpRecord {
  enum class Phase { kPending, kFinishing, kDone };

  OpRecord(Op op, int64_t seq, int64_t bytes, std::string label);
  OpRecord(const OpRecord&) = delete;
  OpRecord& operator=(const OpRecord&) = delete;
  ~OpRecord();

  const Op op;
  const int64_t seq;
  const int64_t bytes;
  const std::string label;  // "[rank N] all_gather #7"
  const absl::Time launched;
  cudaEvent_t start = nullptr, end = nullptr;  // both recorded once the record is outstanding

  Phase phase = Phase::kPending;     // State::mu
  absl::Status status;               // State::mu; meaningful once kDone
  std::vector<at::Tensor> stash;     // State::mu; the op's tensors until it is safe to drop them
};

// What the communicator shares with its Works and its watchdog.
class State {
 public:
  using NotifyFn = std::function<void(Op, int64_t bytes, double seconds, int64_t seq, bool ok)>;

  // `comm` is ended only by Fail() or CloseComm().
  State(int rank, int size, const NcclOptions& options, ncclComm_t comm);

  const int rank, size, device;
  const cudaStream_t compute_stream;
  const absl::Duration op_timeout;

  // "[rank N] <op> #<seq>".
  std::string Label(Op op, int64_t seq) const;

  absl::Status status() const;
  CommStats Stats() const;
  void SetNotify(NotifyFn fn);

  // Runs `fn` with the NCCL handle unless the communicator was aborted or
  // destroyed (then Aborted). No NCCL call on the handle may race its abort.
  absl::Status WithComm(const std::string& where, const std::function<absl::Status(ncclComm_t)>& fn);

  // Makes `rec` outstanding, or fails it at once when the communicator failed
  // in the meantime (another thread's Fail may race a launch).
  void Register(const std::shared_ptr<OpRecord>& rec);

  // Fails a record that never became outstanding (its launch failed).
  void FailUnregistered(const std::shared_ptr<OpRecord>& rec, const absl::Status& s);

  // The first failure of the communicator: recorded as status(), the NCCL
  // communicator aborted, every outstanding op failed. `culprit` is the
  // sequence number whose op failed (0: none in particular). Later calls do
  // nothing. Call without holding any of State's locks.
  void Fail(const absl::Status& why, int64_t culprit);

  // One watchdog pass over the outstanding ops.
  void Poll();

  // The watchdog's loop: asleep while nothing is outstanding, a pass every
  // kPollInterval otherwise, one last pass once stopping.
  void Watch();

  void Stop();

  // The oldest op still outstanding (null: none).
  std::shared_ptr<OpRecord> OldestOutstanding() const;

  // The end of a healthy NCCL communicator: finalize (flushes its work),
  // polled up to op_timeout, then destroy; aborted instead if that fails.
  void CloseComm();

  // Waits up to `timeout` for `rec` to be done; true if it is.
  bool AwaitDone(const OpRecord& rec, absl::Duration timeout) const;
  absl::Status DoneStatus(const OpRecord& rec) const;
  bool Done(const OpRecord& rec) const;
  // Drops the op's tensors (outside the lock: the allocator runs there).
  void Unstash(OpRecord& rec);

 private:
  void Tell(Op op, int64_t bytes, double seconds, int64_t seq, bool ok);

  // Records in kFinishing: tell the observer, then mark them done (so a wait
  // returns only after the observer heard of the op).
  void FinishFailed(const std::vector<std::shared_ptr<OpRecord>>& recs, const absl::Status& s);

  // Accounts ops whose end event completed, at completion.
  void Complete(const std::vector<std::pair<std::shared_ptr<OpRecord>, double>>& finished);

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<OpRecord>> outstanding_ ABSL_GUARDED_BY(mu_);  // in sequence order
  std::set<int64_t> completed_ahead_ ABSL_GUARDED_BY(mu_);  // completed beyond last_completed_seq
  CommStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex comm_mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_);
  bool comm_gone_ ABSL_GUARDED_BY(comm_mu_) = false;  // aborted or destroyed: never touch comm_ again

  absl::Mutex notify_mu_;
  NotifyFn notify_ ABSL_GUARDED_BY(notify_mu_);
};

}  // namespace shardline::comm::nccl_internal
