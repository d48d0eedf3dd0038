// The NCCL backend. The shape (see the header for the contract):
//
//   caller thread   Launch: validate, take a sequence number, order the op's
//                   stream after the compute stream, time the NCCL call with
//                   two events, register the op's record as outstanding.
//   watchdog        polls the outstanding records: an end event that
//                   completed is accounted (stats, observer) and its record
//                   marked done; a late op, an NCCL async error or a CUDA error
//                   fails the communicator (State::Fail).
//   State::Fail     first failure wins: abort the NCCL communicator once,
//                   fail every outstanding record, tell the observer.
//
// Records and State are shared with the Works, so a Work never dangles.
// Locks: NcclCommunicator::launch_mu_ (one launch at a time) is taken first;
// State's three are never held together: mu_ guards the bookkeeping, comm_mu_
// the NCCL handle (no NCCL call on it may race ncclCommAbort), notify_mu_ the
// way to the observer (held while it runs, so its calls never overlap; it may
// call Stats(), which takes mu_).
#ifdef SHARDLINE_WITH_CUDA

#include "worker/comm/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shardline::comm {
namespace {

// How long a host wait that saw the end event complete gives the watchdog to
// account the op (it polls every millisecond; this only bounds a stuck one).
constexpr absl::Duration kAccountGrace = absl::Seconds(1);
constexpr absl::Duration kPollInterval = absl::Milliseconds(1);

std::string RankPrefix(int rank) { return absl::StrCat("[rank ", rank, "] "); }

// `where` is "[rank N] op #seq" or "[rank N] ...". The failed call's error is
// cleared from the thread's CUDA state, so that LibTorch's next launch check
// on this thread does not report it a second time (sticky errors stay).
absl::Status CudaStatus(const std::string& where, const char* call, cudaError_t e) {
  (void)cudaGetLastError();  // clearing, not checking: `e` is what we report
  return absl::InternalError(
      absl::StrCat(where, ": ", call, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status NcclStatus(const std::string& where, const char* call, ncclResult_t r, ncclComm_t comm) {
  std::string msg = absl::StrCat(where, ": ", call, ": ", ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&msg, " (", last, ")");
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError: return absl::UnavailableError(msg);
    default: return absl::InternalError(msg);
  }
}

absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default: return absl::InvalidArgumentError(absl::StrCat("dtype ", at::toString(t), " is not supported by NCCL"));
  }
}

// Sets the current device for a scope and restores the caller's afterwards.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (restore_) (void)cudaSetDevice(previous_);  // nothing to report to from here
  }
  absl::Status Set(int device, const std::string& where) {
    if (cudaError_t e = cudaGetDevice(&previous_); e != cudaSuccess) return CudaStatus(where, "cudaGetDevice", e);
    if (previous_ == device) return absl::OkStatus();
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaStatus(where, "cudaSetDevice", e);
    restore_ = true;
    return absl::OkStatus();
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// One launched collective. The immutable part is set before the record is
// shared; `phase`, `status` and `stash` are guarded by State::mu.
struct OpRecord {
  enum class Phase { kPending, kFinishing, kDone };

  OpRecord(Op op, int64_t seq, int64_t bytes, std::string label)
      : op(op), seq(seq), bytes(bytes), label(std::move(label)), launched(absl::Now()) {}
  OpRecord(const OpRecord&) = delete;
  OpRecord& operator=(const OpRecord&) = delete;
  ~OpRecord() {
    // An event may be destroyed while still pending; failures here (a CUDA
    // context already torn down at exit) leave nothing to clean up.
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (end != nullptr) (void)cudaEventDestroy(end);
  }

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

  State(int rank, int size, const NcclOptions& options, ncclComm_t comm)
      : rank(rank), size(size), device(options.device), compute_stream(options.compute_stream),
        op_timeout(options.op_timeout), comm_(comm) {}

  const int rank, size, device;
  const cudaStream_t compute_stream;
  const absl::Duration op_timeout;

  std::string Label(Op op, int64_t seq) const { return absl::StrCat(RankPrefix(rank), OpName(op), " #", seq); }

  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return failure_;
  }
  CommStats Stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }
  void SetNotify(NotifyFn fn) {
    absl::MutexLock lock(&notify_mu_);
    notify_ = std::move(fn);
  }

  // Runs `fn` with the NCCL handle unless the communicator was aborted or
  // destroyed (then Aborted). No NCCL call on the handle may race its abort.
  absl::Status WithComm(const std::string& where, const std::function<absl::Status(ncclComm_t)>& fn) {
    absl::MutexLock lock(&comm_mu_);
    if (comm_gone_) return absl::AbortedError(absl::StrCat(where, ": the NCCL communicator was aborted"));
    return fn(comm_);
  }

  // Makes `rec` outstanding, or fails it at once when the communicator failed
  // in the meantime (another thread's Fail may race a launch).
  void Register(const std::shared_ptr<OpRecord>& rec) {
    absl::Status prior;
    {
      absl::MutexLock lock(&mu_);
      if (failure_.ok()) {
        outstanding_.push_back(rec);  // wakes the watchdog (its Await condition)
        return;
      }
      prior = failure_;
      rec->phase = OpRecord::Phase::kFinishing;
    }
    FinishFailed({rec}, absl::Status(prior.code(), absl::StrCat(rec->label, ": failed by an earlier failure: ",
                                                                prior.message())));
  }

  // Fails a record that never became outstanding (its launch failed).
  void FailUnregistered(const std::shared_ptr<OpRecord>& rec, const absl::Status& s) {
    {
      absl::MutexLock lock(&mu_);
      rec->phase = OpRecord::Phase::kFinishing;
    }
    FinishFailed({rec}, s);
  }

  // The first failure of the communicator: recorded as status(), the NCCL
  // communicator aborted, every outstanding op failed. `culprit` is the
  // sequence number whose op failed (0: none in particular). Later calls do
  // nothing. Call without holding any of State's locks.
  void Fail(const absl::Status& why, int64_t culprit) {
    std::vector<std::shared_ptr<OpRecord>> failed;
    {
      absl::MutexLock lock(&mu_);
      if (!failure_.ok()) return;
      failure_ = why;
      failed.assign(outstanding_.begin(), outstanding_.end());
      outstanding_.clear();
      for (auto& rec : failed) rec->phase = OpRecord::Phase::kFinishing;
    }
    // Abort before any waiter learns of the failure: once a Wait returns, the
    // caller may free the op's buffers, so NCCL's kernels must be gone.
    {
      absl::MutexLock lock(&comm_mu_);
      if (!comm_gone_) {
        comm_gone_ = true;
        if (ncclResult_t r = ncclCommAbort(comm_); r != ncclSuccess) {
          std::fprintf(stderr, "%sncclCommAbort: %s\n", RankPrefix(rank).c_str(), ncclGetErrorString(r));
        }
      }
    }
    for (auto& rec : failed) {
      absl::Status s = rec->seq == culprit
                           ? why
                           : absl::Status(why.code(), absl::StrCat(rec->label, ": failed with the communicator: ",
                                                                   why.message()));
      FinishFailed({rec}, s);
    }
  }

  // One watchdog pass over the outstanding ops.
  void Poll() {
    std::vector<std::shared_ptr<OpRecord>> ops;
    {
      absl::MutexLock lock(&mu_);
      ops.assign(outstanding_.begin(), outstanding_.end());
    }
    if (ops.empty()) return;
    absl::Status failure;
    int64_t culprit = ops.front()->seq;
    absl::Status comm = WithComm(ops.front()->label, [&](ncclComm_t c) {
      ncclResult_t async = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(c, &async); r != ncclSuccess) {
        return NcclStatus(ops.front()->label, "ncclCommGetAsyncError", r, c);
      }
      if (async != ncclSuccess && async != ncclInProgress) {
        return NcclStatus(ops.front()->label, "NCCL async error", async, c);
      }
      return absl::OkStatus();
    });
    if (!comm.ok() && !absl::IsAborted(comm)) failure = comm;  // Aborted: someone else's Fail is under way

    std::vector<std::pair<std::shared_ptr<OpRecord>, double>> finished;
    const absl::Time now = absl::Now();
    for (const auto& rec : ops) {
      if (!failure.ok()) break;
      const cudaError_t q = cudaEventQuery(rec->end);
      if (q == cudaSuccess) {
        float ms = 0;
        if (cudaError_t e = cudaEventElapsedTime(&ms, rec->start, rec->end); e != cudaSuccess) {
          failure = CudaStatus(rec->label, "cudaEventElapsedTime", e);
          culprit = rec->seq;
          break;
        }
        finished.emplace_back(rec, ms / 1e3);
      } else if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not-ready is not an error; keep the thread's state clean
        if (now - rec->launched > op_timeout) {
          failure = absl::DeadlineExceededError(absl::StrCat(
              rec->label, ": not complete ", absl::FormatDuration(now - rec->launched),
              " after its launch (op timeout ", absl::FormatDuration(op_timeout),
              "); the NCCL communicator was aborted"));
          culprit = rec->seq;
          break;
        }
      } else {
        failure = CudaStatus(rec->label, "cudaEventQuery", q);
        culprit = rec->seq;
        break;
      }
    }
    Complete(finished);
    if (!failure.ok()) Fail(failure, culprit);
  }

  // The watchdog's loop: asleep while nothing is outstanding, a pass every
  // kPollInterval otherwise, one last pass once stopping.
  void Watch() {
    DeviceGuard guard;  // for the thread's lifetime: the watchdog works on one device
    if (absl::Status s = guard.Set(device, RankPrefix(rank) + "watchdog"); !s.ok()) Fail(s, 0);
    for (;;) {
      bool stop;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !outstanding_.empty(); };
        mu_.Await(absl::Condition(&ready));
        stop = stopping_;
      }
      Poll();
      if (stop) return;
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), kPollInterval);
    }
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }

  // The oldest op still outstanding (null: none).
  std::shared_ptr<OpRecord> OldestOutstanding() const {
    absl::MutexLock lock(&mu_);
    return outstanding_.empty() ? nullptr : outstanding_.front();
  }

  // The end of a healthy NCCL communicator: finalize (flushes its work),
  // polled up to op_timeout, then destroy; aborted instead if that fails.
  void CloseComm() {
    absl::MutexLock lock(&comm_mu_);
    if (comm_gone_) return;
    comm_gone_ = true;
    const std::string where = RankPrefix(rank) + "closing the NCCL communicator";
    ncclResult_t r = ncclCommFinalize(comm_);
    const absl::Time deadline = absl::Now() + op_timeout;
    while (r == ncclInProgress && absl::Now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ncclResult_t state = ncclInProgress;
      if (ncclResult_t q = ncclCommGetAsyncError(comm_, &state); q != ncclSuccess) {
        r = q;
        break;
      }
      r = state;
    }
    if (r == ncclSuccess) r = ncclCommDestroy(comm_);
    if (r == ncclSuccess) return;
    std::fprintf(stderr, "%s: %s; aborting it\n", where.c_str(), ncclGetErrorString(r));
    if (ncclResult_t a = ncclCommAbort(comm_); a != ncclSuccess) {
      std::fprintf(stderr, "%s: ncclCommAbort: %s\n", where.c_str(), ncclGetErrorString(a));
    }
  }

  // Waits up to `timeout` for `rec` to be done; true if it is.
  bool AwaitDone(const OpRecord& rec, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto done = [&rec]() { return rec.phase == OpRecord::Phase::kDone; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  absl::Status DoneStatus(const OpRecord& rec) const {
    absl::MutexLock lock(&mu_);
    return rec.status;
  }
  bool Done(const OpRecord& rec) const {
    absl::MutexLock lock(&mu_);
    return rec.phase == OpRecord::Phase::kDone;
  }
  // Drops the op's tensors (outside the lock: the allocator runs there).
  void Unstash(OpRecord& rec) {
    std::vector<at::Tensor> drop;  // destroyed after `lock` releases mu_
    absl::MutexLock lock(&mu_);
    drop.swap(rec.stash);
  }

 private:
  void Tell(Op op, int64_t bytes, double seconds, int64_t seq, bool ok) {
    absl::MutexLock lock(&notify_mu_);
    if (notify_) notify_(op, bytes, seconds, seq, ok);
  }

  // Records in kFinishing: tell the observer, then mark them done (so a wait
  // returns only after the observer heard of the op).
  void FinishFailed(const std::vector<std::shared_ptr<OpRecord>>& recs, const absl::Status& s) {
    for (const auto& rec : recs) {
      Tell(rec->op, 0, absl::ToDoubleSeconds(absl::Now() - rec->launched), rec->seq, false);
    }
    std::vector<at::Tensor> drop;  // destroyed after `lock` releases mu_
    absl::MutexLock lock(&mu_);
    for (const auto& rec : recs) {
      rec->phase = OpRecord::Phase::kDone;
      rec->status = s;
      for (auto& t : rec->stash) drop.push_back(std::move(t));
      rec->stash.clear();
    }
  }

  // Accounts ops whose end event completed, at completion.
  void Complete(const std::vector<std::pair<std::shared_ptr<OpRecord>, double>>& finished) {
    if (finished.empty()) return;
    std::vector<std::pair<std::shared_ptr<OpRecord>, double>> mine;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [rec, seconds] : finished) {
        if (rec->phase != OpRecord::Phase::kPending) continue;  // a Fail got there first
        rec->phase = OpRecord::Phase::kFinishing;
        outstanding_.erase(std::find(outstanding_.begin(), outstanding_.end(), rec));
        OpStats& s = stats_.ops[static_cast<int>(rec->op)];
        s.calls += 1;
        s.bytes_sent += rec->bytes;
        s.seconds += seconds;
        completed_ahead_.insert(rec->seq);
        while (!completed_ahead_.empty() && *completed_ahead_.begin() == stats_.last_completed_seq + 1) {
          stats_.last_completed_seq += 1;
          completed_ahead_.erase(completed_ahead_.begin());
        }
        mine.emplace_back(rec, seconds);
      }
    }
    for (const auto& [rec, seconds] : mine) Tell(rec->op, rec->bytes, seconds, rec->seq, true);
    std::vector<at::Tensor> drop;  // destroyed after `lock` releases mu_
    absl::MutexLock lock(&mu_);
    for (const auto& entry : mine) {
      OpRecord& rec = *entry.first;
      rec.phase = OpRecord::Phase::kDone;
      rec.status = absl::OkStatus();
      for (auto& t : rec.stash) drop.push_back(std::move(t));
      rec.stash.clear();
    }
  }

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

// A call that never launched (bad arguments, or the communicator had failed).
class FailedWork : public Work {
 public:
  explicit FailedWork(absl::Status s) : status_(std::move(s)) {}
  absl::Status Wait(absl::Duration) override { return status_; }
  absl::Status WaitOnDevice(absl::Duration) override { return status_; }
  bool Done() const override { return true; }

 private:
  const absl::Status status_;
};

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<State> state, std::shared_ptr<OpRecord> rec)
      : state_(std::move(state)), rec_(std::move(rec)) {}

  absl::Status Wait(absl::Duration timeout) override {
    bool done = state_->AwaitDone(*rec_, timeout);
    if (!done) {
      // The watchdog may not have polled since the op finished on the device.
      const cudaError_t q = cudaEventQuery(rec_->end);
      if (q == cudaSuccess) {
        done = state_->AwaitDone(*rec_, kAccountGrace);
      } else if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not-ready is not an error
      } else {
        absl::Status s = CudaStatus(rec_->label, "cudaEventQuery", q);
        state_->Fail(s, rec_->seq);
        return s;
      }
    }
    if (!done) {
      absl::Status s = absl::DeadlineExceededError(
          absl::StrCat(rec_->label, ": not complete within the host wait of ", absl::FormatDuration(timeout),
                       "; the NCCL communicator was aborted"));
      state_->Fail(s, rec_->seq);
      return s;
    }
    if (absl::Status s = state_->DoneStatus(*rec_); !s.ok()) return s;
    return OrderComputeStream();
  }

  absl::Status WaitOnDevice(absl::Duration /*timeout: the watchdog's op_timeout bounds it*/) override {
    if (state_->Done(*rec_)) {
      if (absl::Status s = state_->DoneStatus(*rec_); !s.ok()) return s;
    } else if (absl::Status f = state_->status(); !f.ok()) {
      return absl::Status(f.code(), absl::StrCat(rec_->label, ": failed with the communicator: ", f.message()));
    }
    return OrderComputeStream();
  }

  bool Done() const override { return state_->Done(*rec_); }

 private:
  // The compute stream waits for the op's end event; the op's tensors may go.
  absl::Status OrderComputeStream() {
    DeviceGuard guard;
    absl::Status s = guard.Set(state_->device, rec_->label);
    if (s.ok()) {
      if (cudaError_t e = cudaStreamWaitEvent(state_->compute_stream, rec_->end, 0); e != cudaSuccess) {
        s = CudaStatus(rec_->label, "cudaStreamWaitEvent(compute stream)", e);
      }
    }
    if (!s.ok()) {
      state_->Fail(s, rec_->seq);
      return s;
    }
    state_->Unstash(*rec_);
    return absl::OkStatus();
  }

  const std::shared_ptr<State> state_;
  const std::shared_ptr<OpRecord> rec_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, const NcclOptions& options)
      : state_(std::make_shared<State>(rank, size, options, comm)), options_(options) {
    state_->SetNotify([this](Op op, int64_t bytes, double seconds, int64_t seq, bool ok) {
      Notify(op, bytes, seconds, seq, ok);
    });
  }

  // Streams, the ordering event, the barrier word, the watchdog. A failure
  // aborts the NCCL communicator; the object is then only destroyed.
  absl::Status Init() {
    const std::string where = RankPrefix(state_->rank) + "creating the NCCL communicator";
    absl::Status s = InitResources(where);
    if (!s.ok()) {
      state_->Fail(s, 0);
      return s;
    }
    watchdog_ = std::thread([state = state_] { state->Watch(); });
    return absl::OkStatus();
  }

  ~NcclCommunicator() override {
    state_->Stop();
    if (watchdog_.joinable()) watchdog_.join();  // its last pass accounts what finished
    if (std::shared_ptr<OpRecord> oldest = state_->OldestOutstanding()) {
      state_->Fail(absl::AbortedError(absl::StrCat(oldest->label,
                                                   ": the communicator was destroyed before the op finished")),
                   oldest->seq);
    }
    state_->SetNotify(nullptr);  // Works that outlive us never reach the observer
    state_->CloseComm();
    DeviceGuard guard;
    if (absl::Status s = guard.Set(options_.device, RankPrefix(state_->rank) + "~NcclCommunicator"); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    }
    auto log = [this](const char* call, cudaError_t e) {
      if (e != cudaSuccess) {
        std::fprintf(stderr, "%s~NcclCommunicator: %s: %s\n", RankPrefix(state_->rank).c_str(), call,
                     cudaGetErrorString(e));
      }
    };
    if (barrier_word_ != nullptr) log("cudaFree(barrier word)", cudaFree(barrier_word_));
    if (ready_ != nullptr) log("cudaEventDestroy", cudaEventDestroy(ready_));
    for (cudaStream_t s : owned_streams_) log("cudaStreamDestroy", cudaStreamDestroy(s));
  }

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  std::string backend() const override { return "nccl"; }

  std::shared_ptr<Work> AllGather(at::Tensor out, at::Tensor in) override {
    constexpr Op op = Op::kAllGather;
    if (absl::Status s = CheckPair(op, out, "output", in, "input"); !s.ok()) return Rejected(s);
    if (out.numel() != in.numel() * size()) {
      return Rejected(Invalid(op, absl::StrCat("output holds ", out.numel(), " elements, expected ", size(), " x ",
                                               in.numel())));
    }
    const ncclDataType_t type = *NcclType(in.scalar_type());
    return Launch(op, RingAllGatherBytes(out.nbytes(), size()), {out, in}, ag_stream_, "ncclAllGather",
                  [&](ncclComm_t c, cudaStream_t st) {
                    return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), type, c, st);
                  });
  }

  std::shared_ptr<Work> ReduceScatter(at::Tensor out, at::Tensor in) override {
    constexpr Op op = Op::kReduceScatter;
    if (absl::Status s = CheckPair(op, out, "output", in, "input"); !s.ok()) return Rejected(s);
    if (in.numel() != out.numel() * size()) {
      return Rejected(Invalid(op, absl::StrCat("input holds ", in.numel(), " elements, expected ", size(), " x ",
                                               out.numel())));
    }
    const ncclDataType_t type = *NcclType(in.scalar_type());
    return Launch(op, RingReduceScatterBytes(in.nbytes(), size()), {out, in}, rs_stream_, "ncclReduceScatter",
                  [&](ncclComm_t c, cudaStream_t st) {
                    return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), type, ncclSum, c, st);
                  });
  }

  std::shared_ptr<Work> AllReduce(at::Tensor inout) override {
    constexpr Op op = Op::kAllReduce;
    if (absl::Status s = CheckTensor(op, inout, "tensor"); !s.ok()) return Rejected(s);
    const ncclDataType_t type = *NcclType(inout.scalar_type());
    const int64_t bytes = RingAllReduceBytes(inout.nbytes(), inout.element_size(), size());
    return Launch(op, bytes, {inout}, rs_stream_, "ncclAllReduce", [&](ncclComm_t c, cudaStream_t st) {
      return ncclAllReduce(inout.data_ptr(), inout.data_ptr(), inout.numel(), type, ncclSum, c, st);
    });
  }

  std::shared_ptr<Work> Broadcast(at::Tensor inout, int root) override {
    constexpr Op op = Op::kBroadcast;
    if (absl::Status s = CheckTensor(op, inout, "tensor"); !s.ok()) return Rejected(s);
    if (root < 0 || root >= size()) {
      return Rejected(Invalid(op, absl::StrCat("root ", root, " is outside a group of size ", size())));
    }
    const ncclDataType_t type = *NcclType(inout.scalar_type());
    const int64_t bytes = rank() == root && size() > 1 ? inout.nbytes() : 0;
    return Launch(op, bytes, {inout}, ag_stream_, "ncclBroadcast", [&](ncclComm_t c, cudaStream_t st) {
      return ncclBroadcast(inout.data_ptr(), inout.data_ptr(), inout.numel(), type, root, c, st);
    });
  }

  // NCCL has no barrier: an all-reduce of one int is one.
  std::shared_ptr<Work> Barrier() override {
    return Launch(Op::kBarrier, 0, {}, ag_stream_, "ncclAllReduce", [&](ncclComm_t c, cudaStream_t st) {
      return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, c, st);
    });
  }

  CommStats Stats() const override { return state_->Stats(); }
  absl::Status status() const override { return state_->status(); }

 private:
  using NcclCall = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

  absl::Status InitResources(const std::string& where) {
    DeviceGuard guard;
    if (absl::Status s = guard.Set(options_.device, where); !s.ok()) return s;
    int least = 0, greatest = 0;
    if (cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest); e != cudaSuccess) {
      return CudaStatus(where, "cudaDeviceGetStreamPriorityRange", e);
    }
    // Streams passed in must be on our device (the legacy default stream is).
    auto check_device = [&](cudaStream_t given, const char* role) -> absl::Status {
      if (given == nullptr) return absl::OkStatus();
      int dev = -1;
      if (cudaError_t e = cudaStreamGetDevice(given, &dev); e != cudaSuccess) {
        return CudaStatus(where, "cudaStreamGetDevice", e);
      }
      if (dev != options_.device) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": the ", role, " stream is on cuda:", dev,
                                                       ", the communicator on cuda:", options_.device));
      }
      return absl::OkStatus();
    };
    if (absl::Status s = check_device(options_.compute_stream, "compute"); !s.ok()) return s;
    // Our own streams get the highest priority, as FSDP2's do: a collective's
    // few blocks should not queue behind a large compute kernel.
    auto stream_for = [&](cudaStream_t given, const char* role, cudaStream_t* out) -> absl::Status {
      if (given != nullptr) {
        *out = given;
        return check_device(given, role);
      }
      if (cudaError_t e = cudaStreamCreateWithPriority(out, cudaStreamNonBlocking, greatest); e != cudaSuccess) {
        return CudaStatus(where, "cudaStreamCreateWithPriority", e);
      }
      owned_streams_.push_back(*out);
      return absl::OkStatus();
    };
    if (absl::Status s = stream_for(options_.all_gather_stream, "all-gather", &ag_stream_); !s.ok()) return s;
    if (absl::Status s = stream_for(options_.reduce_scatter_stream, "reduce-scatter", &rs_stream_); !s.ok()) {
      return s;
    }
    if (cudaError_t e = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming); e != cudaSuccess) {
      ready_ = nullptr;
      return CudaStatus(where, "cudaEventCreateWithFlags", e);
    }
    if (cudaError_t e = cudaMalloc(&barrier_word_, sizeof(int32_t)); e != cudaSuccess) {
      barrier_word_ = nullptr;
      return CudaStatus(where, "cudaMalloc(barrier word)", e);
    }
    if (cudaError_t e = cudaMemset(barrier_word_, 0, sizeof(int32_t)); e != cudaSuccess) {
      return CudaStatus(where, "cudaMemset(barrier word)", e);
    }
    return absl::OkStatus();
  }

  absl::Status Invalid(Op op, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(RankPrefix(rank()), OpName(op), ": ", what));
  }
  static std::shared_ptr<Work> Rejected(absl::Status s) { return std::make_shared<FailedWork>(std::move(s)); }

  absl::Status CheckTensor(Op op, const at::Tensor& t, const char* role) const {
    if (!t.defined()) return Invalid(op, absl::StrCat(role, " is undefined"));
    if (!t.is_cuda()) return Invalid(op, absl::StrCat(role, " is on ", t.device().str(), ", not a CUDA device"));
    if (t.device().index() != options_.device) {
      return Invalid(op, absl::StrCat(role, " is on ", t.device().str(), ", the communicator on cuda:",
                                      options_.device));
    }
    if (!t.is_contiguous()) return Invalid(op, absl::StrCat(role, " is not contiguous"));
    if (auto type = NcclType(t.scalar_type()); !type.ok()) {
      return Invalid(op, absl::StrCat(role, ": ", type.status().message()));
    }
    return absl::OkStatus();
  }
  absl::Status CheckPair(Op op, const at::Tensor& a, const char* a_role, const at::Tensor& b,
                         const char* b_role) const {
    if (absl::Status s = CheckTensor(op, a, a_role); !s.ok()) return s;
    if (absl::Status s = CheckTensor(op, b, b_role); !s.ok()) return s;
    if (a.scalar_type() != b.scalar_type()) {
      return Invalid(op, absl::StrCat(a_role, " is ", at::toString(a.scalar_type()), ", ", b_role, " is ",
                                      at::toString(b.scalar_type())));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Work> Launch(Op op, int64_t bytes, std::vector<at::Tensor> tensors, cudaStream_t stream,
                               const char* nccl_name, const NcclCall& call) {
    absl::MutexLock launch(&launch_mu_);
    const int64_t seq = ++next_seq_;
    const std::string label = state_->Label(op, seq);
    if (absl::Status f = state_->status(); !f.ok()) {
      return Rejected(absl::AbortedError(
          absl::StrCat(label, ": the communicator was aborted by an earlier failure: ", f.message())));
    }
    auto rec = std::make_shared<OpRecord>(op, seq, bytes, label);
    rec->stash = std::move(tensors);  // not shared yet
    if (absl::Status s = Enqueue(*rec, stream, nccl_name, call); !s.ok()) {
      state_->Fail(s, seq);
      state_->FailUnregistered(rec, s);
    } else {
      state_->Register(rec);
    }
    return std::make_shared<NcclWork>(state_, rec);
  }

  // Orders `stream` after the compute stream and enqueues the timed NCCL call.
  absl::Status Enqueue(OpRecord& rec, cudaStream_t stream, const char* nccl_name, const NcclCall& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(launch_mu_) {
    const std::string& where = rec.label;
    DeviceGuard guard;
    if (absl::Status s = guard.Set(options_.device, where); !s.ok()) return s;
    if (cudaError_t e = cudaEventCreate(&rec.start); e != cudaSuccess) {
      rec.start = nullptr;
      return CudaStatus(where, "cudaEventCreate", e);
    }
    if (cudaError_t e = cudaEventCreate(&rec.end); e != cudaSuccess) {
      rec.end = nullptr;
      return CudaStatus(where, "cudaEventCreate", e);
    }
    // The op must see every kernel issued on the compute stream so far.
    if (cudaError_t e = cudaEventRecord(ready_, options_.compute_stream); e != cudaSuccess) {
      return CudaStatus(where, "cudaEventRecord(compute stream)", e);
    }
    if (cudaError_t e = cudaStreamWaitEvent(stream, ready_, 0); e != cudaSuccess) {
      return CudaStatus(where, "cudaStreamWaitEvent", e);
    }
    if (cudaError_t e = cudaEventRecord(rec.start, stream); e != cudaSuccess) {
      return CudaStatus(where, "cudaEventRecord(start)", e);
    }
    ncclResult_t r = ncclSuccess;
    if (absl::Status s = state_->WithComm(where, [&](ncclComm_t c) {
          r = call(c, stream);
          return r == ncclSuccess || r == ncclInProgress ? absl::OkStatus() : NcclStatus(where, nccl_name, r, c);
        });
        !s.ok()) {
      return s;
    }
    // A non-blocking communicator may still be enqueueing (connecting, on a
    // first op): the end event must follow the kernel, so wait for that.
    const absl::Time deadline = rec.launched + options_.op_timeout;
    for (int polls = 0; r == ncclInProgress; ++polls) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(where, ": ", nccl_name, " still enqueueing after ",
                                                        absl::FormatDuration(options_.op_timeout),
                                                        "; the NCCL communicator was aborted"));
      }
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (absl::Status s = state_->WithComm(where, [&](ncclComm_t c) {
            ncclResult_t state = ncclInProgress;
            if (ncclResult_t q = ncclCommGetAsyncError(c, &state); q != ncclSuccess) {
              return NcclStatus(where, "ncclCommGetAsyncError", q, c);
            }
            r = state;
            return r == ncclSuccess || r == ncclInProgress ? absl::OkStatus() : NcclStatus(where, nccl_name, r, c);
          });
          !s.ok()) {
        return s;
      }
    }
    if (cudaError_t e = cudaEventRecord(rec.end, stream); e != cudaSuccess) {
      return CudaStatus(where, "cudaEventRecord(end)", e);
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<State> state_;
  const NcclOptions options_;
  std::thread watchdog_;
  // Set by Init(), read by launches and the destructor only.
  cudaStream_t ag_stream_ = nullptr;  // all-gather, broadcast, barrier
  cudaStream_t rs_stream_ = nullptr;  // reduce-scatter, all-reduce
  std::vector<cudaStream_t> owned_streams_;
  void* barrier_word_ = nullptr;

  absl::Mutex launch_mu_;  // one launch at a time (calls should already come one at a time)
  int64_t next_seq_ ABSL_GUARDED_BY(launch_mu_) = 0;
  cudaEvent_t ready_ = nullptr;  // recorded on the compute stream at each call; used under launch_mu_
};

}  // namespace

bool CudaDeviceAvailable() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // "no device" is the answer, not an error to keep
    return false;
  }
  return n > 0;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const std::string& group_name, int rank, int size,
    const NcclOptions& options) {
  const std::string where = absl::StrCat(RankPrefix(rank), "group ", group_name);
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": rank ", rank, " is outside a group of size ", size));
  }
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  DeviceGuard guard;  // NCCL binds the communicator to the current device
  if (absl::Status s = guard.Set(options.device, where); !s.ok()) return s;

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  const std::string key = group_name + "/nccl_unique_id";
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclStatus(where, "ncclGetUniqueId", r, nullptr);
    }
    try {
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(where, ": publishing the NCCL unique id failed: ", e.what()));
    }
  } else {
    try {
      const int64_t ms = std::max<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()), 1);
      store->wait({key}, std::chrono::milliseconds(ms));
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(absl::StrCat(where, ": no NCCL unique id from rank 0 within ",
                                                      absl::FormatDuration(options.connect_timeout), ": ",
                                                      e.what()));
    }
    try {
      std::vector<uint8_t> v = store->get(key);
      if (v.size() != sizeof(id)) {
        return absl::DataLossError(absl::StrCat(where, ": the NCCL unique id has ", v.size(), " bytes, expected ",
                                                sizeof(id)));
      }
      std::memcpy(&id, v.data(), sizeof(id));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(where, ": reading the NCCL unique id failed: ", e.what()));
    }
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and every call return at once; we poll against deadlines
  config.commName = group_name.c_str();
  ncclComm_t comm = nullptr;
  auto abort_comm = [&](absl::Status s) {
    if (comm != nullptr) {
      if (ncclResult_t a = ncclCommAbort(comm); a != ncclSuccess) {
        std::fprintf(stderr, "%s: ncclCommAbort: %s\n", where.c_str(), ncclGetErrorString(a));
      }
    }
    return s;
  };
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) return abort_comm(NcclStatus(where, "ncclCommInitRankConfig", r, comm));
  for (;;) {
    ncclResult_t state = ncclInProgress;
    if (ncclResult_t q = ncclCommGetAsyncError(comm, &state); q != ncclSuccess) {
      return abort_comm(NcclStatus(where, "ncclCommGetAsyncError", q, comm));
    }
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) return abort_comm(NcclStatus(where, "ncclCommInitRankConfig", state, comm));
    if (absl::Now() >= deadline) {
      return abort_comm(absl::DeadlineExceededError(absl::StrCat(
          where, ": NCCL init did not finish within ", absl::FormatDuration(options.connect_timeout),
          " (a peer missing?); aborted")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  auto c = std::make_unique<NcclCommunicator>(comm, rank, size, options);  // owns comm from here
  if (absl::Status s = c->Init(); !s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace shardline::comm

#endif  // SHARDLINE_WITH_CUDA
