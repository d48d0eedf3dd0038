// The NCCL communicator's shared state and its watchdog (see the header).
#ifdef SHARDLINE_WITH_CUDA

#include "worker/comm/nccl_state.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shardline::comm::nccl_internal {

std::string RankPrefix(int rank) { return absl::StrCat("[rank ", rank, "] "); }

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

DeviceGuard::~DeviceGuard() {
  if (restore_) (void)cudaSetDevice(previous_);  // nothing to report to from here
}

absl::Status DeviceGuard::Set(int device, const std::string& where) {
  if (cudaError_t e = cudaGetDevice(&previous_); e != cudaSuccess) return CudaStatus(where, "cudaGetDevice", e);
  if (previous_ == device) return absl::OkStatus();
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaStatus(where, "cudaSetDevice", e);
  restore_ = true;
  return absl::OkStatus();
}

OpRecord::OpRecord(Op op, int64_t seq, int64_t bytes, std::string label)
    : op(op), seq(seq), bytes(bytes), label(std::move(label)), launched(absl::Now()) {}

OpRecord::~OpRecord() {
  // An event may be destroyed while still pending; failures here (a CUDA
  // context already torn down at exit) leave nothing to clean up.
  if (start != nullptr) (void)cudaEventDestroy(start);
  if (end != nullptr) (void)cudaEventDestroy(end);
}

State::State(int rank, int size, const NcclOptions& options, ncclComm_t comm)
    : rank(rank), size(size), device(options.device), compute_stream(options.compute_stream),
      op_timeout(options.op_timeout), comm_(comm) {}

std::string State::Label(Op op, int64_t seq) const { return absl::StrCat(RankPrefix(rank), OpName(op), " #", seq); }

absl::Status State::status() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

CommStats State::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void State::SetNotify(NotifyFn fn) {
  absl::MutexLock lock(&notify_mu_);
  notify_ = std::move(fn);
}

absl::Status State::WithComm(const std::string& where, const std::function<absl::Status(ncclComm_t)>& fn) {
  absl::MutexLock lock(&comm_mu_);
  if (comm_gone_) return absl::AbortedError(absl::StrCat(where, ": the NCCL communicator was aborted"));
  return fn(comm_);
}

void State::Register(const std::shared_ptr<OpRecord>& rec) {
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

void State::FailUnregistered(const std::shared_ptr<OpRecord>& rec, const absl::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    rec->phase = OpRecord::Phase::kFinishing;
  }
  FinishFailed({rec}, s);
}

void State::Fail(const absl::Status& why, int64_t culprit) {
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

void State::Poll() {
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

void State::Watch() {
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

void State::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

std::shared_ptr<OpRecord> State::OldestOutstanding() const {
  absl::MutexLock lock(&mu_);
  return outstanding_.empty() ? nullptr : outstanding_.front();
}

void State::CloseComm() {
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

bool State::AwaitDone(const OpRecord& rec, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto done = [&rec]() { return rec.phase == OpRecord::Phase::kDone; };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

absl::Status State::DoneStatus(const OpRecord& rec) const {
  absl::MutexLock lock(&mu_);
  return rec.status;
}

bool State::Done(const OpRecord& rec) const {
  absl::MutexLock lock(&mu_);
  return rec.phase == OpRecord::Phase::kDone;
}

void State::Unstash(OpRecord& rec) {
  std::vector<at::Tensor> drop;  // destroyed after `lock` releases mu_
  absl::MutexLock lock(&mu_);
  drop.swap(rec.stash);
}

void State::Tell(Op op, int64_t bytes, double seconds, int64_t seq, bool ok) {
  absl::MutexLock lock(&notify_mu_);
  if (notify_) notify_(op, bytes, seconds, seq, ok);
}

void State::FinishFailed(const std::vector<std::shared_ptr<OpRecord>>& recs, const absl::Status& s) {
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

void State::Complete(const std::vector<std::pair<std::shared_ptr<OpRecord>, double>>& finished) {
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

}  // namespace shardline::comm::nccl_internal

#endif  // SHARDLINE_WITH_CUDA
