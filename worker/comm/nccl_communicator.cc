// The NCCL backend. The shape (see the header for the contract, and
// nccl_state.h for the state the Works and the watchdog share):
//
//   caller thread   Launch: validate, take a sequence number, order the op's
//                   stream after the compute stream, time the NCCL call with
//                   two events, register the op's record as outstanding.
//   watchdog        State::Watch (nccl_state.h) accounts completed ops and
//                   fails the communicator on a late op or an error.
//
// Locks: NcclCommunicator::launch_mu_ (one launch at a time) is taken first,
// before any of State's (nccl_state.h says which and how).
#ifdef SHARDLINE_WITH_CUDA

#include "worker/comm/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/nccl_state.h"

namespace shardline::comm {
namespace {

using nccl_internal::CudaStatus;
using nccl_internal::DeviceGuard;
using nccl_internal::NcclStatus;
using nccl_internal::OpRecord;
using nccl_internal::RankPrefix;
using nccl_internal::State;

// How long a host wait that saw the end event complete gives the watchdog to
// account the op (it polls every millisecond; this only bounds a stuck one).
constexpr absl::Duration kAccountGrace = absl::Seconds(1);

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
  bool ordered_on_device() const override { return true; }

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
  void Abort(const absl::Status& why) override { state_->Fail(why, /*culprit=*/0); }

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
  config.blocking = 0;  // every call returns at once and is polled against a deadline (the header says why)
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
