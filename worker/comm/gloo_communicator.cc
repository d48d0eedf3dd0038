#include "worker/comm/gloo_communicator.h"

#include <csignal>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"

namespace shardline::comm {
namespace {

// The first line of an exception text (c10 errors carry a backtrace after it).
std::string FirstLine(const std::exception& e) {
  std::string s = e.what();
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// All-reduces up to this size run on the ring (RingAllReduce), larger ones
// on Gloo's segmented all-reduce. Every all-reduce of a full_shard step is a
// few scalars; below 64 KiB a collective is latency-bound at any link speed
// of interest (0.5 ms at 1 Gbit/s), so both take the same 2(n-1) rounds.
constexpr int64_t kRingAllReduceMaxBytes = 64 << 10;
// Ring steps of one op are tagged seq * kTagsPerOp + step; an all-reduce takes
// 2(n-1) steps, so a group has at most kTagsPerOp / 2 ranks.
constexpr int64_t kTagsPerOp = 1024;

std::chrono::milliseconds Remaining(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return std::chrono::milliseconds(std::max<int64_t>(ms, 1));
}

// Completion state shared by the caller (Wait) and the comm thread (Finish).
class TaskWork : public Work {
 public:
  // on_wait_timeout aborts the communicator and returns the status to
  // report (with the link the ring was waiting on, where it was).
  explicit TaskWork(std::function<absl::Status(absl::Status)> on_wait_timeout, std::string what)
      : on_wait_timeout_(std::move(on_wait_timeout)), what_(std::move(what)) {}

  absl::Status Wait(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      absl::Status s = absl::DeadlineExceededError(
          absl::StrCat(what_, " did not complete within ", absl::FormatDuration(timeout)));
      mu_.Unlock();
      s = on_wait_timeout_(std::move(s));  // aborts the communicator; must not hold mu_
      mu_.Lock();
      return s;
    }
    return status_;
  }
  // Gloo completes on the host, after any staged outputs were copied back.
  absl::Status WaitOnDevice(absl::Duration timeout) override { return Wait(timeout); }
  bool Done() const override {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  void Finish(absl::Status s) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(s);
    done_ = true;
  }

 private:
  std::function<absl::Status(absl::Status)> on_wait_timeout_;
  const std::string what_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A tensor as Gloo sees it: itself on the host, else a host copy (of its
// values where the op reads it) that WriteBack copies to the device.
class HostView {
 public:
  HostView(const at::Tensor& t, bool read)
      : device_(t), host_(t.is_cpu() ? t : read ? t.to(at::kCPU) : at::empty(t.sizes(), t.options().device(at::kCPU))) {}
  at::Tensor& host() { return host_; }
  void WriteBack() {
    if (!device_.is_cpu()) device_.copy_(host_);  // synchronous for pageable memory
  }

 private:
  at::Tensor device_, host_;
};

// Runs `body` on host views of CUDA tensors; LibTorch's exceptions (a
// failed copy) become a Status naming the op.
template <typename Body>
absl::Status OnHost(const std::string& label, Body body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(label, ": staging through host memory failed: ", FirstLine(e)));
  }
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int size,
                   GlooOptions options)
      : pg_(std::move(pg)), rank_(rank), size_(size), options_(std::move(options)) {
    thread_ = std::thread([this] { Loop(); });
  }

  ~GlooCommunicator() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
    if (aborted()) {
      // A Gloo context with a failed pair can block in its destructor; an
      // aborted communicator is never reused, so it is dropped without one.
      (void)pg_.release();
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::shared_ptr<Work> AllGather(at::Tensor out, at::Tensor in) override { return AllGatherAfter(out, in, nullptr); }
  std::shared_ptr<Work> AllGatherAfter(at::Tensor out, at::Tensor in, std::shared_ptr<Work> after) override {
    return Enqueue(Op::kAllGather, in, std::move(after), [this, out, in](int64_t seq, absl::Time deadline, int64_t* sent) {
      return OnHost(OpLabel(Op::kAllGather, seq), [&] {
        HostView o(out, /*read=*/false), i(in, /*read=*/true);
        SL_RETURN_IF_ERROR(RingAllGather(Op::kAllGather, o.host(), i.host(), seq, /*first_step=*/0, deadline, sent));
        o.WriteBack();
        return absl::OkStatus();
      });
    });
  }
  std::shared_ptr<Work> ReduceScatter(at::Tensor out, at::Tensor in) override {
    return ReduceScatterAfter(out, in, nullptr);
  }
  std::shared_ptr<Work> ReduceScatterAfter(at::Tensor out, at::Tensor in, std::shared_ptr<Work> after) override {
    return Enqueue(Op::kReduceScatter, in, std::move(after), [this, out, in](int64_t seq, absl::Time deadline, int64_t* sent) {
      return OnHost(OpLabel(Op::kReduceScatter, seq), [&] {
        // Staged, `out` may alias a chunk of `in` on the device but not on
        // the host; the write-back restores the aliasing's meaning.
        HostView o(out, /*read=*/false), i(in, /*read=*/true);
        SL_RETURN_IF_ERROR(RingReduceScatter(Op::kReduceScatter, o.host(), i.host(), seq, /*first_step=*/0, deadline, sent));
        o.WriteBack();
        return absl::OkStatus();
      });
    });
  }
  std::shared_ptr<Work> AllReduce(at::Tensor inout) override { return AllReduceAfter(std::move(inout), nullptr); }
  std::shared_ptr<Work> AllReduceAfter(at::Tensor inout, std::shared_ptr<Work> after) override {
    return Enqueue(Op::kAllReduce, inout, std::move(after), [this, inout](int64_t seq, absl::Time deadline, int64_t* sent) {
      return OnHost(OpLabel(Op::kAllReduce, seq), [&] {
        HostView t(inout, /*read=*/true);
        SL_RETURN_IF_ERROR(inout.nbytes() <= kRingAllReduceMaxBytes
                               ? RingAllReduce(t.host(), seq, deadline, sent)
                               : NativeAllReduce(t.host(), seq, deadline, sent));
        t.WriteBack();
        return absl::OkStatus();
      });
    });
  }
  std::shared_ptr<Work> Broadcast(at::Tensor inout, int root) override {
    return Enqueue(Op::kBroadcast, inout, [this, inout, root](int64_t seq, absl::Time deadline, int64_t* sent) {
      if (size_ == 1) return absl::OkStatus();
      return OnHost(OpLabel(Op::kBroadcast, seq), [&] {
        HostView t(inout, /*read=*/true);
        std::vector<at::Tensor> ts{t.host()};
        c10d::BroadcastOptions o;
        o.rootRank = root;
        o.timeout = Remaining(deadline);
        if (rank_ == root) *sent = inout.nbytes();
        SL_RETURN_IF_ERROR(RunGloo(Op::kBroadcast, seq, deadline, [&] { return pg_->broadcast(ts, o); }));
        t.WriteBack();
        return absl::OkStatus();
      });
    });
  }
  // A ring all-gather of one byte per rank: a rank has what every other one
  // sent after entering the barrier, and a link that fails is named.
  std::shared_ptr<Work> Barrier() override {
    return Enqueue(Op::kBarrier, at::Tensor(), [this](int64_t seq, absl::Time deadline, int64_t* sent) {
      if (size_ == 1) return absl::OkStatus();
      return OnHost(OpLabel(Op::kBarrier, seq), [&] {
        at::Tensor all = at::zeros({size_}, at::TensorOptions().dtype(at::kByte));
        return RingAllGather(Op::kBarrier, all, all.narrow(0, rank_, 1), seq, /*first_step=*/0, deadline, sent);
      });
    });
  }

  CommStats Stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }
  absl::Status status() const override {
    absl::MutexLock lock(&mu_);
    return abort_status_;
  }

 private:
  using Body = std::function<absl::Status(int64_t seq, absl::Time deadline, int64_t* bytes_sent)>;
  struct Task {
    Op op;
    int64_t seq;
    Body body;
    std::shared_ptr<TaskWork> work;
    // Recorded on the caller's current stream at the call where the op's
    // tensors live on a device: the op's thread waits for it before reading.
    std::optional<c10::Event> ready;
    // Another communicator's op whose result this one reads (the ...After ops).
    std::shared_ptr<Work> after;
  };

  std::string OpLabel(Op op, int64_t seq) const {
    return absl::StrCat("[rank ", rank_, "] ", OpName(op), " #", seq);
  }
  bool aborted() const {
    absl::MutexLock lock(&mu_);
    return !abort_status_.ok();
  }

 public:
  void Abort(const absl::Status& why) override {
    std::vector<c10::intrusive_ptr<c10d::Work>> waiting;
    {
      absl::MutexLock lock(&mu_);
      if (abort_status_.ok()) abort_status_ = why;
      waiting = ring_step_;
    }
    // c10d's point-to-point works end a pending wait when aborted (Gloo's
    // abortWaitRecv / abortWaitSend): the wait returns false at once.
    for (auto& w : waiting) AbortWork(*w);
  }

 private:
  static void AbortWork(c10d::Work& w) {
    try {
      w.abort();
    } catch (const std::exception&) {
      // Nothing to end: the work had completed.
    }
  }
  // Publishes a ring step's receive and send for Abort (empty: none in
  // progress); OK unless the communicator was aborted already.
  absl::Status SetRingStep(std::vector<c10::intrusive_ptr<c10d::Work>> works) {
    absl::MutexLock lock(&mu_);
    if (works.empty()) waiting_on_.reset();
    ring_step_ = std::move(works);
    return abort_status_;
  }
  // The link the ring step waits on now: what a host wait that runs out
  // reports (TaskWork).
  void SetWaitingOn(const LinkFault& link) {
    absl::MutexLock lock(&mu_);
    waiting_on_ = link;
  }

  std::shared_ptr<Work> Enqueue(Op op, const at::Tensor& tensor, Body body) {
    return Enqueue(op, tensor, nullptr, std::move(body));
  }
  std::shared_ptr<Work> Enqueue(Op op, const at::Tensor& tensor, std::shared_ptr<Work> after, Body body) {
    std::optional<c10::Event> ready;
    if (tensor.defined() && !tensor.is_cpu()) {
      const c10::Device d = tensor.device();
      ready.emplace(d.type());
      ready->record(c10::impl::VirtualGuardImpl(d.type()).getStream(d));
    }
    absl::MutexLock lock(&mu_);
    const int64_t seq = ++next_seq_;
    auto work = std::make_shared<TaskWork>(
        [this](absl::Status s) {
          std::optional<LinkFault> link;
          {
            absl::MutexLock lock(&mu_);
            link = waiting_on_;
          }
          Abort(s);
          return link ? WithLinkFault(std::move(s), *link) : s;
        },
        OpLabel(op, seq));
    queue_.push_back(Task{op, seq, std::move(body), work, std::move(ready), std::move(after)});
    return work;
  }

  void Loop() {
    for (;;) {
      Task task;
      absl::Status aborted_with;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopping, nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
        aborted_with = abort_status_;
      }
      if (!aborted_with.ok()) {
        task.work->Finish(absl::AbortedError(absl::StrCat(
            OpLabel(task.op, task.seq), ": communicator aborted after an earlier failure: ",
            aborted_with.message())));
        continue;
      }
      // (The wait for `after` is not this op's: its seconds start after it.)
      absl::Status s = task.after ? task.after->Wait(options_.op_timeout) : absl::OkStatus();
      int64_t sent = 0;
      const absl::Time t0 = absl::Now();
      if (s.ok()) s = WaitReady(task, t0 + options_.op_timeout);
      if (s.ok()) s = task.body(task.seq, t0 + options_.op_timeout, &sent);
      const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
      {
        absl::MutexLock lock(&mu_);
        OpStats& st = stats_.ops[static_cast<int>(task.op)];
        st.calls += 1;
        st.bytes_sent += sent;
        st.seconds += secs;
        if (s.ok()) stats_.last_completed_seq = task.seq;
        else if (abort_status_.ok()) abort_status_ = s;
      }
      Notify(task.op, sent, secs, task.seq, s.ok());
      task.work->Finish(std::move(s));
    }
  }

  // Waits until the caller's stream reached the point of the call, polling
  // within the op's deadline (a hung kernel must not hold this thread).
  absl::Status WaitReady(const Task& task, absl::Time deadline) {
    if (!task.ready) return absl::OkStatus();
    return OnHost(OpLabel(task.op, task.seq), [&] {
      while (!task.ready->query()) {
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat(OpLabel(task.op, task.seq), ": the caller's stream did not reach the call in time"));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      return absl::OkStatus();
    });
  }

  // Runs one c10d Gloo collective and waits for it within the deadline.
  absl::Status RunGloo(Op op, int64_t seq, absl::Time deadline,
                       const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
    try {
      auto w = start();
      if (!w->wait(Remaining(deadline))) {
        return absl::DeadlineExceededError(absl::StrCat(OpLabel(op, seq), " timed out"));
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(OpLabel(op, seq), " failed: ", FirstLine(e)));
    }
    return absl::OkStatus();
  }

  // The job rank of group rank `r` (GlooOptions.job_ranks).
  int JobRank(int r) const {
    return r >= 0 && r < static_cast<int>(options_.job_ranks.size()) ? options_.job_ranks[r] : r;
  }
  // `s` with the link it failed on (group ranks `from` -> `to`), in job ranks.
  absl::Status Link(absl::Status s, int from, int to, int64_t seq, int step) const {
    return WithLinkFault(std::move(s), LinkFault{JobRank(from), JobRank(to), seq, step});
  }

  // One ring step: send `send` to the right neighbour while receiving `recv`
  // from the left one, both within the op's deadline.
  absl::Status Exchange(Op op, int64_t seq, int step, const at::Tensor& send, const at::Tensor& recv,
                        absl::Time deadline, int64_t* sent) {
    const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
    const uint32_t tag = static_cast<uint32_t>((seq * kTagsPerOp + step) & 0x7fffffff);
    std::vector<at::Tensor> s{send}, r{recv};
    c10::intrusive_ptr<c10d::Work> rw, sw;
    try {
      rw = pg_->recv(r, left, tag);
    } catch (const std::exception& e) {
      return Link(absl::UnavailableError(absl::StrCat(OpLabel(op, seq), " ring step ", step, ": cannot receive from rank ",
                                                      JobRank(left), " (", FirstLine(e), ")")),
                  left, rank_, seq, step);
    }
    try {
      sw = pg_->send(s, right, tag);
    } catch (const std::exception& e) {
      return Link(absl::UnavailableError(absl::StrCat(OpLabel(op, seq), " ring step ", step, ": cannot send to rank ",
                                                      JobRank(right), " (", FirstLine(e), ")")),
                  rank_, right, seq, step);
    }
    // An Abort from now on ends these waits; one that came before ends them here.
    if (absl::Status gone = SetRingStep({rw, sw}); !gone.ok()) {
      AbortWork(*rw);
      AbortWork(*sw);
    }
    absl::Status st = WaitRingStep(op, seq, step, rw, sw, deadline);
    (void)SetRingStep({});
    if (st.ok()) *sent += send.nbytes();
    return st;
  }

  absl::Status WaitRingStep(Op op, int64_t seq, int step, const c10::intrusive_ptr<c10d::Work>& rw,
                            const c10::intrusive_ptr<c10d::Work>& sw, absl::Time deadline) {
    const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
    auto aborted_by = [&](const std::string& what) {
      absl::MutexLock lock(&mu_);
      return abort_status_.ok() ? absl::OkStatus()
                                : absl::AbortedError(absl::StrCat(OpLabel(op, seq), " ring step ", step, ": ", what,
                                                                  " ended: ", abort_status_.message()));
    };
    SetWaitingOn(LinkFault{JobRank(left), JobRank(rank_), seq, step});
    try {
      if (!rw->wait(Remaining(deadline))) throw std::runtime_error("timed out");
    } catch (const std::exception& e) {
      if (absl::Status a = aborted_by(absl::StrCat("waiting for rank ", JobRank(left))); !a.ok()) return a;
      const bool late = absl::Now() >= deadline;
      const std::string msg = absl::StrCat(OpLabel(op, seq), " ring step ", step, ": no data from rank ",
                                           JobRank(left), late ? " before the deadline (" : " (",
                                           FirstLine(e), ")");
      return Link(late ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg), left, rank_, seq, step);
    }
    SetWaitingOn(LinkFault{JobRank(rank_), JobRank(right), seq, step});
    try {
      if (!sw->wait(Remaining(deadline))) throw std::runtime_error("timed out");
    } catch (const std::exception& e) {
      if (absl::Status a = aborted_by(absl::StrCat("sending to rank ", JobRank(right))); !a.ok()) return a;
      return Link(absl::UnavailableError(absl::StrCat(OpLabel(op, seq), " ring step ", step, ": sending to rank ",
                                                      JobRank(right), " failed (", FirstLine(e), ")")),
                  rank_, right, seq, step);
    }
    return absl::OkStatus();
  }

  // out = [chunk_0 .. chunk_{n-1}], chunk_rank = in. Step s forwards the chunk
  // that arrived in step s-1 (initially our own) to the right. Steps are
  // numbered from first_step: within one op each ring step has its own tag.
  absl::Status RingAllGather(Op op, at::Tensor out, const at::Tensor& in, int64_t seq, int first_step,
                             absl::Time deadline, int64_t* sent) {
    const int n = size_;
    const int64_t c = out.numel() / n;
    if (in.numel() != c || out.numel() != c * n) {
      return absl::InvalidArgumentError(absl::StrCat(OpLabel(op, seq), ": output holds ", out.numel(),
                                                     " elements, expected ", n, " x ", in.numel()));
    }
    auto chunk = [&](int i) { return out.narrow(0, ((i % n) + n) % n * c, c); };
    if (in.data_ptr() != chunk(rank_).data_ptr()) chunk(rank_).copy_(in);
    for (int s = 0; s < n - 1; ++s) {
      absl::Status st = Exchange(op, seq, first_step + s, chunk(rank_ - s), chunk(rank_ - s - 1), deadline, sent);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // After n-1 steps chunk `rank` of `in` holds the sum of every rank's chunk
  // `rank`: step s sends the partial sum of chunk rank-s-1 to the right and
  // adds what arrives from the left into chunk rank-s-2. `in` is scratch.
  absl::Status RingReduceScatter(Op op, at::Tensor out, at::Tensor in, int64_t seq, int first_step,
                                 absl::Time deadline, int64_t* sent) {
    const int n = size_;
    if (in.numel() != out.numel() * n) {
      return absl::InvalidArgumentError(absl::StrCat(OpLabel(op, seq), ": input holds ", in.numel(),
                                                     " elements, expected ", n, " x ", out.numel()));
    }
    const int64_t c = out.numel();
    auto chunk = [&](int i) { return in.narrow(0, ((i % n) + n) % n * c, c); };
    at::Tensor tmp = n > 1 ? at::empty({c}, in.options()) : at::Tensor();
    for (int s = 0; s < n - 1; ++s) {
      absl::Status st = Exchange(op, seq, first_step + s, chunk(rank_ - s - 1), tmp, deadline, sent);
      if (!st.ok()) return st;
      chunk(rank_ - s - 2).add_(tmp);
    }
    at::Tensor mine = chunk(rank_);
    if (mine.data_ptr() != out.data_ptr()) out.copy_(mine);
    return absl::OkStatus();
  }

  // A small all-reduce (the loss, the grad norm, a small replica's
  // gradients) is the ring's reduce-scatter then all-gather of the tensor
  // padded to n chunks: the bytes of RingAllReduceBytes, the 2(n-1) rounds of
  // Gloo's own, and a failed link named like any ring step's.
  absl::Status RingAllReduce(at::Tensor inout, int64_t seq, absl::Time deadline, int64_t* sent) {
    if (size_ == 1 || inout.numel() == 0) return absl::OkStatus();
    const int64_t elems = inout.numel(), chunk = (elems + size_ - 1) / size_;
    at::Tensor padded = at::zeros({chunk * size_}, inout.options());
    padded.narrow(0, 0, elems).copy_(inout.reshape({-1}));
    at::Tensor mine = padded.narrow(0, rank_ * chunk, chunk);
    SL_RETURN_IF_ERROR(RingReduceScatter(Op::kAllReduce, mine, padded, seq, /*first_step=*/0, deadline, sent));
    SL_RETURN_IF_ERROR(RingAllGather(Op::kAllReduce, padded, mine, seq, /*first_step=*/size_ - 1, deadline, sent));
    inout.copy_(padded.narrow(0, 0, elems).view(inout.sizes()));
    return absl::OkStatus();
  }

  // A large all-reduce is Gloo's own (c10d's allreduce: a ring reduce-scatter and
  // all-gather, cut into segments so the sums of one segment overlap the
  // transfer of the next). Our unsegmented ring ran 2(n-1) blocking rounds
  // with every add after its receive and cost 10-35% more at 4-64 MB
  // (bench/collective_bench); all-gather and reduce-scatter stay ours, where
  // c10d's are slower (reduce-scatter is an all-reduce plus a slice there).
  // c10d reports no byte counts: the ring's are counted by its formula. Its
  // error names no peer, so a link that fails here is not blamed by name.
  absl::Status NativeAllReduce(at::Tensor inout, int64_t seq, absl::Time deadline, int64_t* sent) {
    if (size_ == 1) return absl::OkStatus();
    std::vector<at::Tensor> ts{inout};
    c10d::AllreduceOptions o;
    o.timeout = Remaining(deadline);
    absl::Status st = RunGloo(Op::kAllReduce, seq, deadline, [&] { return pg_->allreduce(ts, o); });
    if (st.ok()) *sent = RingAllReduceBytes(inout.nbytes(), inout.element_size(), size_);
    return st;
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  const int rank_, size_;
  const GlooOptions options_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  // The receive and send of the ring step in progress, for Abort to end.
  std::vector<c10::intrusive_ptr<c10d::Work>> ring_step_ ABSL_GUARDED_BY(mu_);
  std::optional<LinkFault> waiting_on_ ABSL_GUARDED_BY(mu_);  // see SetWaitingOn
  CommStats stats_ ABSL_GUARDED_BY(mu_);
};

// Gloo's TCP pairs write to their sockets with writev, which raises SIGPIPE
// when the peer has died: its default action would kill this process, where
// the ring step should see EPIPE and fail the collective naming the peer
// (as Python-hosted Gloo does: CPython ignores SIGPIPE at start). Set once
// per process, before the first pair connects.
void IgnoreSigpipe() {
  static const bool ignored = std::signal(SIGPIPE, SIG_IGN) != SIG_ERR;
  (void)ignored;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const std::string& group_name, int rank, int size,
    const GlooOptions& options) {
  IgnoreSigpipe();
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group_name, ": rank ", rank,
                                                   " is outside a group of size ", size));
  }
  if (size > kTagsPerOp / 2) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group_name, ": ", size,
                                                   " ranks; a Gloo group has at most ", kTagsPerOp / 2));
  }
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(group_name, store);
    auto opts = c10d::ProcessGroupGloo::Options::create(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(options.connect_timeout)));
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
    // Two worker threads, as c10d defaults to: with one, its all-reduce ran
    // 10-17% slower than the raw call at 64 MB, N=2 (bench/collective_bench).
    opts->threads = 2;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
    return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(pg), rank, size, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("[rank ", rank, "] group ", group_name,
                                               ": Gloo rendezvous failed: ", FirstLine(e)));
  }
}

}  // namespace shardline::comm
