#include "worker/comm/communicator.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace shardline::comm {

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllReduce: return "all_reduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kBarrier: return "barrier";
  }
  return "?";
}

namespace {
constexpr char kLinkFaultUrl[] = "type.shardline.dev/link_fault";
}  // namespace

absl::Status WithLinkFault(absl::Status s, const LinkFault& f) {
  s.SetPayload(kLinkFaultUrl, absl::Cord(absl::StrCat(f.from, " ", f.to, " ", f.seq, " ", f.step)));
  return s;
}

std::optional<LinkFault> LinkFaultOf(const absl::Status& s) {
  auto p = s.GetPayload(kLinkFaultUrl);  // absl::optional
  if (!p) return std::nullopt;
  std::vector<std::string> parts = absl::StrSplit(std::string(*p), ' ');
  LinkFault f;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &f.from) || !absl::SimpleAtoi(parts[1], &f.to) ||
      !absl::SimpleAtoi(parts[2], &f.seq) || !absl::SimpleAtoi(parts[3], &f.step)) {
    return std::nullopt;
  }
  return f;
}

namespace {

class DoneWork : public Work {
 public:
  absl::Status Wait(absl::Duration) override { return absl::OkStatus(); }
  absl::Status WaitOnDevice(absl::Duration) override { return absl::OkStatus(); }
  bool Done() const override { return true; }
};

// An op of a group of one that must follow another communicator's op
// (the ...After ops): it runs, once, when it is waited for, after `after`.
class DeferredWork : public Work {
 public:
  DeferredWork(std::shared_ptr<Work> after, std::function<void()> run)
      : after_(std::move(after)), run_(std::move(run)) {}
  absl::Status Wait(absl::Duration timeout) override { return RunAfter(after_->Wait(timeout)); }
  absl::Status WaitOnDevice(absl::Duration timeout) override { return RunAfter(after_->WaitOnDevice(timeout)); }
  bool Done() const override {
    absl::MutexLock lock(&mu_);
    return ran_;
  }

 private:
  absl::Status RunAfter(absl::Status after) {
    if (!after.ok()) return after;
    absl::MutexLock lock(&mu_);
    if (!ran_) run_();
    ran_ = true;
    return absl::OkStatus();
  }
  const std::shared_ptr<Work> after_;
  const std::function<void()> run_;
  mutable absl::Mutex mu_;
  bool ran_ ABSL_GUARDED_BY(mu_) = false;
};

class SelfCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::shared_ptr<Work> AllGather(at::Tensor out, at::Tensor in) override { return Copy(out, in, Op::kAllGather); }
  std::shared_ptr<Work> ReduceScatter(at::Tensor out, at::Tensor in) override {
    return Copy(out, in, Op::kReduceScatter);
  }
  // The copy must read what `after` wrote: it runs when the op is waited for.
  std::shared_ptr<Work> AllGatherAfter(at::Tensor out, at::Tensor in, std::shared_ptr<Work> after) override {
    if (!after) return AllGather(out, in);
    return std::make_shared<DeferredWork>(std::move(after), [this, out, in]() mutable { Copy(out, in, Op::kAllGather); });
  }
  std::shared_ptr<Work> ReduceScatterAfter(at::Tensor out, at::Tensor in, std::shared_ptr<Work> after) override {
    if (!after) return ReduceScatter(out, in);
    return std::make_shared<DeferredWork>(std::move(after),
                                          [this, out, in]() mutable { Copy(out, in, Op::kReduceScatter); });
  }
  std::shared_ptr<Work> AllReduce(at::Tensor) override { return Count(Op::kAllReduce); }
  std::shared_ptr<Work> Broadcast(at::Tensor, int) override { return Count(Op::kBroadcast); }
  std::shared_ptr<Work> Barrier() override { return Count(Op::kBarrier); }
  CommStats Stats() const override { return stats_; }
  absl::Status status() const override { return absl::OkStatus(); }
  void Abort(const absl::Status&) override {}  // no peer to wait for: every op is done at its call

 private:
  std::shared_ptr<Work> Copy(at::Tensor& out, const at::Tensor& in, Op op) {
    if (out.data_ptr() != in.data_ptr()) out.copy_(in);
    return Count(op);
  }
  std::shared_ptr<Work> Count(Op op) {
    stats_.ops[static_cast<int>(op)].calls += 1;
    stats_.last_completed_seq += 1;
    Notify(op, 0, 0, stats_.last_completed_seq, true);
    return CompletedWork();
  }
  CommStats stats_;
};

}  // namespace

std::shared_ptr<Work> CompletedWork() { return std::make_shared<DoneWork>(); }

std::unique_ptr<Communicator> CreateSelfCommunicator() { return std::make_unique<SelfCommunicator>(); }

}  // namespace shardline::comm
