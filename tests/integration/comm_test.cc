// GlooCommunicator: results and bytes of every collective at N = 3 (sizes
// that do not divide), fp32 and bf16; a hung peer fails the op within its
// deadline naming the op and the peer it waited on, the barrier and a small
// all-reduce naming the link; a peer process killed
// with SIGKILL fails the next collective naming the op and the peer's rank;
// an aborted communicator stays so; Abort from another thread ends a ring
// step that waits.
#include "worker/comm/gloo_communicator.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "gloo_ranks.h"

extern char** environ;

namespace shardline::comm {
namespace {

// Past the ring's 64 KiB in fp32 and bf16: Gloo's own all-reduce.
constexpr int64_t kBigAllReduce = 40000;

TEST(GlooCommunicator, CollectivesAndBytesAtThreeRanks) {
  constexpr int n = 3;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    OnRanks(n, GlooOptions{}, [&](int r, Communicator& c) {
      const int64_t chunk = 5;  // all-gather / reduce-scatter chunk per rank
      at::Tensor in = at::full({chunk}, r + 1.0, at::TensorOptions().dtype(dt));
      at::Tensor out = at::empty({n * chunk}, in.options());
      ASSERT_TRUE(c.AllGather(out, in)->Wait(absl::Seconds(10)).ok());
      for (int k = 0; k < n; ++k) EXPECT_EQ(out[k * chunk].item<float>(), k + 1.0f);

      // Reduce-scatter of [0, 1, ..., 14] * (r + 1): chunk r summed over ranks.
      at::Tensor rs_in = at::arange(n * chunk, at::TensorOptions().dtype(at::kFloat)).mul(r + 1).to(dt);
      at::Tensor rs_out = at::empty({chunk}, rs_in.options());
      ASSERT_TRUE(c.ReduceScatter(rs_out, rs_in)->Wait(absl::Seconds(10)).ok());
      for (int64_t i = 0; i < chunk; ++i) EXPECT_EQ(rs_out[i].item<float>(), (r * chunk + i) * 6.0f);

      // On the ring (up to 64 KiB), then on Gloo's own all-reduce.
      at::Tensor ar = at::full({7}, r + 1.0, at::TensorOptions().dtype(dt));  // 7 does not divide by 3
      ASSERT_TRUE(c.AllReduce(ar)->Wait(absl::Seconds(10)).ok());
      EXPECT_TRUE(ar.eq(6.0).all().item<bool>());
      at::Tensor big = at::arange(kBigAllReduce, at::TensorOptions().dtype(at::kFloat)).remainder(7).mul(r + 1).to(dt);
      at::Tensor want = big.to(at::kFloat).div(r + 1).mul(6.0);
      ASSERT_TRUE(c.AllReduce(big)->Wait(absl::Seconds(10)).ok());
      EXPECT_TRUE(big.to(at::kFloat).equal(want));  // sums of small integers: exact in bf16 too

      at::Tensor b = at::full({4}, r == 2 ? 9.0 : 0.0, at::TensorOptions().dtype(dt));
      ASSERT_TRUE(c.Broadcast(b, 2)->Wait(absl::Seconds(10)).ok());
      EXPECT_TRUE(b.eq(9.0).all().item<bool>());
      ASSERT_TRUE(c.Barrier()->Wait(absl::Seconds(10)).ok());

      const int64_t e = in.element_size();
      const CommStats s = c.Stats();
      EXPECT_EQ(s.of(Op::kAllGather).bytes_sent, (n - 1) * chunk * e);      // (n-1)/n of the output
      EXPECT_EQ(s.of(Op::kReduceScatter).bytes_sent, (n - 1) * chunk * e);  // (n-1)/n of the input
      EXPECT_EQ(s.of(Op::kAllReduce).bytes_sent,
                2 * (n - 1) * 3 * e + RingAllReduceBytes(kBigAllReduce * e, e, n));  // 7 padded to 9
      EXPECT_EQ(s.of(Op::kAllReduce).bytes_sent,
                RingAllReduceBytes(7 * e, e, n) + RingAllReduceBytes(kBigAllReduce * e, e, n));
      EXPECT_EQ(s.of(Op::kBarrier).bytes_sent, n - 1);  // one byte per rank, around the ring
      EXPECT_EQ(s.last_completed_seq, 6);
    });
  }
}

TEST(GlooCommunicator, HungPeerFailsWithinTheDeadlineNamingTheOp) {
  GlooOptions o;
  o.op_timeout = absl::Seconds(2);
  OnRanks(3, o, [&](int r, Communicator& c) {
    if (r == 2) {
      absl::SleepFor(absl::Seconds(4));  // never joins the all-gather
      return;
    }
    at::Tensor in = at::ones({4}), out = at::empty({12});
    const absl::Time t0 = absl::Now();
    absl::Status s = c.AllGather(out, in)->Wait(absl::Seconds(30));
    const absl::Duration took = absl::Now() - t0;
    ASSERT_FALSE(s.ok());
    EXPECT_LT(took, absl::Seconds(3.5)) << "failed only after " << took;
    const std::string m(s.message());
    EXPECT_NE(m.find("[rank " + std::to_string(r) + "] all_gather #1"), std::string::npos) << m;
    // The peer by its number (the "[rank r]" prefix alone has the word). The
    // ring blames the neighbour it waited on: rank 0 receives from the hung
    // rank 2 itself; rank 1 got rank 0's first chunk, then waits either to
    // send to rank 2 or for rank 0's next chunk, which rank 0 (stuck behind
    // rank 2) never sends.
    const std::string peers = r == 0 ? "no data from rank 2 " : "(sending to rank 2 |no data from rank 0 )";
    EXPECT_TRUE(std::regex_search(m, std::regex(peers))) << m;
    // Aborted: the next op fails at once and says why.
    absl::Status next = c.AllReduce(at::ones({3}))->Wait(absl::Seconds(30));
    EXPECT_EQ(next.code(), absl::StatusCode::kAborted) << next;
    EXPECT_NE(std::string(next.message()).find("aborted"), std::string::npos);
  });
}

// The ops of every step besides all-gather and reduce-scatter (the barrier,
// the loss and grad-norm all-reduces) name the link they waited on, so that
// the coordinator can blame a cut link whichever op met it first. Rank 0
// receives from the hung rank 2 at the first step of each.
TEST(GlooCommunicator, ABarrierAndASmallAllReduceNameTheLinkTheyWaitedOn) {
  GlooOptions o;
  o.op_timeout = absl::Seconds(1);
  for (const bool barrier : {true, false}) {
    OnRanks(3, o, [&](int r, Communicator& c) {
      if (r == 2) {
        absl::SleepFor(absl::Seconds(2));  // never joins
        return;
      }
      absl::Status s = (barrier ? c.Barrier() : c.AllReduce(at::ones({3}, at::kDouble)))->Wait(absl::Seconds(30));
      ASSERT_FALSE(s.ok());
      const std::optional<LinkFault> link = LinkFaultOf(s);
      ASSERT_TRUE(link.has_value()) << (barrier ? "barrier: " : "all_reduce: ") << s;
      if (r == 0) {
        EXPECT_EQ(link->from, 2) << s;
        EXPECT_EQ(link->to, 0) << s;
        EXPECT_EQ(link->step, 0) << s;
      }
    });
  }
}

// A job being stopped: Abort from another thread ends a ring step that waits
// on a peer which neither sends nor closes its connection (a peer that failed
// and kept its process), long before the op's deadline, and says why.
TEST(GlooCommunicator, AbortEndsAWaitingRingStepAtOnce) {
  GlooOptions o;
  o.op_timeout = absl::Seconds(30);
  absl::Mutex mu;
  std::vector<Communicator*> waiting;
  std::thread stopper;
  OnRanks(3, o, [&](int r, Communicator& c) {
    if (r == 2) {
      absl::SleepFor(absl::Seconds(3));  // alive, connected, never joins
      return;
    }
    {
      absl::MutexLock lock(&mu);
      waiting.push_back(&c);
      if (waiting.size() == 2) {
        stopper = std::thread([&] {
          absl::SleepFor(absl::Milliseconds(300));
          absl::MutexLock l(&mu);
          for (Communicator* w : waiting) w->Abort(absl::CancelledError("told to stop"));
        });
      }
    }
    at::Tensor in = at::ones({4}), out = at::empty({12});
    const absl::Time t0 = absl::Now();
    absl::Status s = c.AllGather(out, in)->Wait(absl::Seconds(60));
    const absl::Duration took = absl::Now() - t0;
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_LT(took, absl::Seconds(2.5)) << "ended only after " << took << " (the op's deadline is 30 s)";
    EXPECT_NE(std::string(s.message()).find("[rank " + std::to_string(r) + "] all_gather #1"), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find("told to stop"), std::string::npos) << s;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled) << c.status();
    // Every later op fails at once.
    EXPECT_EQ(c.AllGather(out, in)->Wait(absl::Seconds(30)).code(), absl::StatusCode::kAborted);
  });
  stopper.join();
}

// --- a peer in another process, killed with SIGKILL ------------------------

int RunPeer(int port) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = false;
  so.numWorkers = 2;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  auto c = CreateGlooCommunicator(store, "p/", 1, 2, GlooOptions{});
  if (!c.ok()) return 2;
  at::Tensor in = at::ones({4}), out = at::empty({8});
  if (!(*c)->AllGather(out, in)->Wait(absl::Seconds(10)).ok()) return 3;
  raise(SIGKILL);  // dies like a crashed or OOM-killed worker
  return 4;
}

TEST(GlooCommunicator, KilledPeerProcessFailsTheNextCollective) {
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.numWorkers = 2;
  so.waitWorkers = false;  // the peer is spawned after the store exists
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  const std::string port = std::to_string(store->getPort());
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(len, 0);
  self[len] = 0;
  std::vector<char*> argv = {self, const_cast<char*>("--peer"), const_cast<char*>(port.c_str()), nullptr};
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ), 0);
  GlooOptions o;
  o.op_timeout = absl::Seconds(5);
  auto c = CreateGlooCommunicator(store, "p/", 0, 2, o);
  ASSERT_TRUE(c.ok()) << c.status();
  at::Tensor in = at::ones({4}), out = at::empty({8});
  ASSERT_TRUE((*c)->AllGather(out, in)->Wait(absl::Seconds(10)).ok());
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  const absl::Time t0 = absl::Now();
  at::Tensor rs_in = at::ones({8}), rs_out = at::empty({4});
  absl::Status s = (*c)->ReduceScatter(rs_out, rs_in)->Wait(absl::Seconds(30));
  ASSERT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(6));
  const std::string m(s.message());
  EXPECT_NE(m.find("[rank 0] reduce_scatter #2"), std::string::npos) << m;
  // The dead peer by its number, as the ring step says it ("no data from
  // rank 1 (", "sending to rank 1 failed", ...), not just any "rank".
  EXPECT_TRUE(std::regex_search(m, std::regex("(from|to) rank 1 "))) << m;
  std::printf("dead peer error: %s\n", m.c_str());
}

}  // namespace
}  // namespace shardline::comm

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--peer") return shardline::comm::RunPeer(std::stoi(argv[2]));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
