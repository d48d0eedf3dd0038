#include "worker/comm/nccl_communicator.h"

#include <nccl.h>

#include <chrono>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace shardline::comm {
namespace {

absl::StatusOr<ncclDataType_t> NcclType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    default: return absl::InvalidArgumentError(absl::StrCat("NCCL: unsupported dtype ", std::string(t.dtype().name())));
  }
}

class NcclCommunicator;

class NcclWork : public Work {
 public:
  NcclWork(NcclCommunicator* owner, Op op, int64_t seq, int64_t bytes, cudaEvent_t start, cudaEvent_t end,
           absl::Status launch_status)
      : owner_(owner), op_(op), seq_(seq), bytes_(bytes), start_(start), end_(end),
        launch_(std::move(launch_status)) {}
  ~NcclWork() override {
    if (start_) cudaEventDestroy(start_);
    if (end_) cudaEventDestroy(end_);
  }
  absl::Status Wait(absl::Duration timeout) override;
  bool Done() const override { return !launch_.ok() || cudaEventQuery(end_) == cudaSuccess; }

 private:
  NcclCommunicator* owner_;
  Op op_;
  int64_t seq_;
  int64_t bytes_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  absl::Status launch_;
  bool accounted_ = false;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, NcclOptions options, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), options_(options), stream_(stream) {
    cudaMalloc(&barrier_word_, sizeof(int));
  }
  ~NcclCommunicator() override {
    cudaFree(barrier_word_);
    if (aborted_) ncclCommAbort(comm_); else ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  std::shared_ptr<Work> AllGather(at::Tensor out, at::Tensor in) override {
    return Launch(Op::kAllGather, RingAllGatherBytes(out.nbytes(), size_), in, [&](ncclDataType_t t) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), t, comm_, stream_);
    });
  }
  std::shared_ptr<Work> ReduceScatter(at::Tensor out, at::Tensor in) override {
    return Launch(Op::kReduceScatter, RingReduceScatterBytes(in.nbytes(), size_), in, [&](ncclDataType_t t) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), t, ncclSum, comm_, stream_);
    });
  }
  std::shared_ptr<Work> AllReduce(at::Tensor inout) override {
    const int64_t bytes = RingAllReduceBytes(inout.nbytes(), inout.element_size(), size_);
    return Launch(Op::kAllReduce, bytes, inout, [&](ncclDataType_t t) {
      return ncclAllReduce(inout.data_ptr(), inout.data_ptr(), inout.numel(), t, ncclSum, comm_, stream_);
    });
  }
  std::shared_ptr<Work> Broadcast(at::Tensor inout, int root) override {
    return Launch(Op::kBroadcast, rank_ == root ? inout.nbytes() : 0, inout, [&](ncclDataType_t t) {
      return ncclBroadcast(inout.data_ptr(), inout.data_ptr(), inout.numel(), t, root, comm_, stream_);
    });
  }
  std::shared_ptr<Work> Barrier() override {
    // NCCL has no barrier: an all-reduce of one int on the comm stream is one.
    at::Tensor b = at::from_blob(barrier_word_, {1},
                                 at::TensorOptions().dtype(at::kInt).device(at::kCUDA, options_.device));
    return Launch(Op::kBarrier, 0, b, [&](ncclDataType_t t) {
      return ncclAllReduce(barrier_word_, barrier_word_, 1, t, ncclSum, comm_, stream_);
    });
  }

  CommStats Stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  // Called by NcclWork once its op finished or failed.
  void Account(Op op, int64_t seq, int64_t bytes, float ms, bool ok) {
    {
      absl::MutexLock lock(&mu_);
      OpStats& s = stats_.ops[static_cast<int>(op)];
      s.seconds += ms / 1e3;
      if (ok) stats_.last_completed_seq = std::max(stats_.last_completed_seq, seq);
    }
    Notify(op, bytes, ms / 1e3, seq, ok);
  }
  void Abort() {
    absl::MutexLock lock(&mu_);
    aborted_ = true;
  }
  cudaStream_t compute_stream() const { return options_.compute_stream; }
  std::string Label(Op op, int64_t seq) const {
    return absl::StrCat("[rank ", rank_, "] ", OpName(op), " #", seq);
  }

 private:
  template <typename Fn>
  std::shared_ptr<Work> Launch(Op op, int64_t bytes, const at::Tensor& t, Fn fn) {
    absl::MutexLock lock(&mu_);
    const int64_t seq = ++next_seq_;
    cudaEvent_t start = nullptr, end = nullptr, ready = nullptr;
    auto fail = [&](absl::Status s) {
      return std::make_shared<NcclWork>(this, op, seq, 0, start, end, std::move(s));
    };
    if (aborted_) return fail(absl::AbortedError(absl::StrCat(Label(op, seq), ": communicator aborted")));
    auto type = NcclType(t);
    if (!type.ok()) return fail(type.status());
    cudaEventCreate(&start);
    cudaEventCreate(&end);
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    // The collective must see everything the compute stream did before it.
    cudaEventRecord(ready, options_.compute_stream);
    cudaStreamWaitEvent(stream_, ready, 0);
    cudaEventDestroy(ready);
    cudaEventRecord(start, stream_);
    ncclResult_t r = fn(*type);
    cudaEventRecord(end, stream_);
    if (r != ncclSuccess && r != ncclInProgress) {
      aborted_ = true;
      return fail(absl::UnavailableError(absl::StrCat(Label(op, seq), ": ", ncclGetErrorString(r))));
    }
    OpStats& s = stats_.ops[static_cast<int>(op)];
    s.calls += 1;
    s.bytes_sent += bytes;
    return std::make_shared<NcclWork>(this, op, seq, bytes, start, end, absl::OkStatus());
  }

  ncclComm_t comm_;
  const int rank_, size_;
  const NcclOptions options_;
  cudaStream_t stream_;
  void* barrier_word_ = nullptr;
  mutable absl::Mutex mu_;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  CommStats stats_ ABSL_GUARDED_BY(mu_);
};

absl::Status NcclWork::Wait(absl::Duration timeout) {
  if (!launch_.ok()) return launch_;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    cudaError_t q = cudaEventQuery(end_);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      owner_->Abort();
      return absl::InternalError(absl::StrCat(owner_->Label(op_, seq_), ": ", cudaGetErrorString(q)));
    }
    if (absl::Now() >= deadline) {
      owner_->Abort();
      return absl::DeadlineExceededError(absl::StrCat(owner_->Label(op_, seq_), " did not complete within ",
                                                      absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (!accounted_) {
    accounted_ = true;
    float ms = 0;
    cudaEventElapsedTime(&ms, start_, end_);
    owner_->Account(op_, seq_, bytes_, ms, true);
  }
  cudaStreamWaitEvent(owner_->compute_stream(), end_, 0);
  return absl::OkStatus();
}

}  // namespace

bool CudaDeviceAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const std::string& group_name, int rank, int size,
    const NcclOptions& options) {
  const std::string where = absl::StrCat("[rank ", rank, "] group ", group_name, ": ");
  if (cudaSetDevice(options.device) != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(where, "no CUDA device ", options.device));
  }
  ncclUniqueId id;
  const std::string key = group_name + "/nccl_unique_id";
  try {
    if (rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) return absl::UnavailableError(absl::StrCat(where, ncclGetErrorString(r)));
      store->set(key, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id),
                                           reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
    } else {
      store->wait({key}, std::chrono::milliseconds(absl::ToInt64Milliseconds(options.connect_timeout)));
      std::vector<uint8_t> v = store->get(key);
      if (v.size() != sizeof(id)) return absl::DataLossError(absl::StrCat(where, "bad NCCL unique id"));
      std::memcpy(&id, v.data(), sizeof(id));
    }
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat(where, "NCCL id exchange failed: ", e.what()));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init is polled against the deadline below
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  while (r == ncclInProgress || (r == ncclSuccess && ncclCommGetAsyncError(comm, &r) == ncclSuccess &&
                                 r == ncclInProgress)) {
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(absl::StrCat(where, "NCCL init timed out waiting for peers"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) return absl::UnavailableError(absl::StrCat(where, ncclGetErrorString(r)));
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  return std::unique_ptr<Communicator>(new NcclCommunicator(comm, rank, size, options, stream));
}

}  // namespace shardline::comm
