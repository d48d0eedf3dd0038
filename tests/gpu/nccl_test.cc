// NcclCommunicator on a real GPU at one rank: every collective checked against
// its definition on the host (fp32 and bf16), device-side waits, stats and the
// observer at completion, rejected arguments, and both abort paths (a host
// wait that runs out, the watchdog's op timeout). Exits 77 (ctest: skipped)
// where no CUDA device exists.
//
// With --two-ranks, instead: two ranks in two processes over the
// non-blocking communicator (the mode nccl_communicator.cc chose), whose
// enqueue path (ncclInProgress, polled) only runs at two ranks or more, then
// MeasureLink over it. On one GPU the ranks meet as NCCL allows
// (TwoRankEnvironment): NCCL_MULTI_RANK_GPU_ENABLE=1 on 2.30+, else a host id
// per rank process.
//
// At one rank every collective finishes almost at once, so the tests that
// need an op still running delay it with at::cuda::sleep (a spinning kernel)
// on a stream it waits for.
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <nccl.h>

#include "worker/comm/nccl_communicator.h"
#include "worker/device/device.h"
#include "worker/run/rendezvous_figures.h"

namespace shardline::comm {
namespace {

constexpr int64_t kSpinCycles = 1'000'000'000;  // about half a second of one spinning kernel

struct Heard {
  Op op;
  int64_t bytes, seq;
  bool ok;
};
class Recorder : public CollectiveObserver {
 public:
  void OnCollective(Op op, int64_t bytes, double, int64_t seq, bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    heard_.push_back({op, bytes, seq, ok});
  }
  std::vector<Heard> heard() const {
    std::lock_guard<std::mutex> lock(mu_);
    return heard_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Heard> heard_;
};

std::unique_ptr<Communicator> Connect(NcclOptions o, std::shared_ptr<Recorder> recorder) {
  auto c = CreateNcclCommunicator(c10::make_intrusive<c10d::HashStore>(), "test", 0, 1, o);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  (*c)->set_observer(std::move(recorder));
  return std::move(*c);
}

// On the host in fp32 (the copy runs on, and waits for, the current stream).
at::Tensor Host(const at::Tensor& t) { return t.to(at::kFloat).cpu(); }
at::Tensor Iota(int64_t n, float plus) { return at::arange(n, at::kFloat) + plus; }

bool EventuallyDone(Work& w) {
  for (int i = 0; i < 10000 && !w.Done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return w.Done();
}

class NcclOneRank : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(NcclOneRank, CollectivesMatchTheirDefinitions) {
  c10::cuda::CUDAStream compute = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStream gather = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard on_compute(compute);  // ATen below runs on the compute stream
  NcclOptions o;
  o.compute_stream = compute.stream();
  o.all_gather_stream = gather.stream();  // a caller's stream; reduce-scatter gets the communicator's own
  auto recorder = std::make_shared<Recorder>();
  auto comm = Connect(o, recorder);
  ASSERT_NE(comm, nullptr);
  const int n = comm->size(), r = comm->rank();
  const int64_t c = 96;  // values stay below 256: exact in bf16
  const auto opts = at::TensorOptions().dtype(GetParam()).device(at::kCUDA, 0);
  const absl::Duration t = absl::Seconds(30);
  // Rank j's input is its own: arange + j (only rank 0 exists here).

  // all_gather: out[n*c] = concatenation of every rank's in[c].
  at::Tensor in = at::arange(c, opts) + r, out = at::full({n * c}, -1, opts);
  ASSERT_TRUE(comm->AllGather(out, in)->Wait(t).ok());
  std::vector<at::Tensor> parts;
  for (int j = 0; j < n; ++j) parts.push_back(Iota(c, j));
  EXPECT_TRUE(at::equal(Host(out), at::cat(parts)));

  // reduce_scatter: out[c] = sum over ranks j of chunk r of in_j[n*c].
  at::Tensor rs_in = at::arange(n * c, opts) + r, rs_out = at::full({c}, -1, opts);
  ASSERT_TRUE(comm->ReduceScatter(rs_out, rs_in)->Wait(t).ok());
  at::Tensor rs_want = at::zeros({c}, at::kFloat);
  for (int j = 0; j < n; ++j) rs_want += Iota(n * c, j).narrow(0, r * c, c);
  EXPECT_TRUE(at::equal(Host(rs_out), rs_want));

  // all_reduce: x <- sum over ranks of x_j.
  at::Tensor x = at::arange(c, opts) + r;
  ASSERT_TRUE(comm->AllReduce(x)->Wait(t).ok());
  at::Tensor ar_want = at::zeros({c}, at::kFloat);
  for (int j = 0; j < n; ++j) ar_want += Iota(c, j);
  EXPECT_TRUE(at::equal(Host(x), ar_want));

  // broadcast from 0: every rank ends with rank 0's buffer.
  at::Tensor b = r == 0 ? at::arange(c, opts) + 7 : at::zeros({c}, opts);
  ASSERT_TRUE(comm->Broadcast(b, 0)->Wait(t).ok());
  EXPECT_TRUE(at::equal(Host(b), Iota(c, 7)));

  ASSERT_TRUE(comm->Barrier()->Wait(t).ok());
  EXPECT_EQ(comm->Stats().last_completed_seq, 5);  // a host wait returns after the op was accounted

  // Device-side wait: the all-gather stream is held up by a spinning kernel,
  // so the op is still running when WaitOnDevice returns (the host did not
  // wait) and is not yet counted; the kernel after it on the compute stream
  // must still read the gathered result, not the -1 fill.
  at::Tensor out2 = at::full({n * c}, -1, opts);
  {
    c10::cuda::CUDAStreamGuard on_gather(gather);
    at::cuda::sleep(kSpinCycles);
  }
  auto w = comm->AllGather(out2, in);
  ASSERT_TRUE(w->WaitOnDevice(t).ok());
  EXPECT_FALSE(w->Done());
  EXPECT_EQ(comm->Stats().of(Op::kAllGather).calls, 1);  // counted at completion, not at launch
  at::Tensor read = out2 * 2 + 1;                         // on the compute stream, after the op
  EXPECT_TRUE(at::equal(Host(read), at::cat(parts) * 2 + 1));
  ASSERT_TRUE(EventuallyDone(*w));

  // Rejected without launching or aborting: no sequence number, no observer call.
  at::Tensor short_out = at::zeros({n * c - 1}, opts), other = at::zeros({n * c}, opts.dtype(at::kDouble));
  for (const auto& bad : {comm->AllGather(short_out, in), comm->ReduceScatter(in, short_out),
                          comm->AllGather(other, in), comm->AllReduce(at::zeros({c}, at::kFloat)),
                          comm->AllReduce(at::zeros({2 * c}, opts).as_strided({c}, {2})),
                          comm->Broadcast(b, n)}) {
    const absl::Status s = bad->Wait(t);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(bad->Done());
  }
  EXPECT_TRUE(comm->status().ok()) << comm->status();
  ASSERT_TRUE(comm->Barrier()->Wait(t).ok());

  // Stats and the observer, at completion: 7 ops, seq 1..7 once each.
  const CommStats st = comm->Stats();
  EXPECT_EQ(st.last_completed_seq, 7);
  EXPECT_EQ(st.of(Op::kAllGather).calls, 2);
  EXPECT_EQ(st.of(Op::kReduceScatter).calls, 1);
  EXPECT_EQ(st.of(Op::kAllReduce).calls, 1);
  EXPECT_EQ(st.of(Op::kBroadcast).calls, 1);
  EXPECT_EQ(st.of(Op::kBarrier).calls, 2);
  EXPECT_EQ(st.of(Op::kAllGather).bytes_sent, 2 * RingAllGatherBytes(out.nbytes(), n));
  EXPECT_EQ(st.of(Op::kReduceScatter).bytes_sent, RingReduceScatterBytes(rs_in.nbytes(), n));
  EXPECT_EQ(st.of(Op::kAllReduce).bytes_sent, RingAllReduceBytes(x.nbytes(), x.element_size(), n));
  EXPECT_EQ(st.of(Op::kBroadcast).bytes_sent, n > 1 ? b.nbytes() : 0);
  for (const OpStats& s : st.ops) EXPECT_GE(s.seconds, 0);
  const std::vector<Heard> heard = recorder->heard();
  const Op order[] = {Op::kAllGather, Op::kReduceScatter, Op::kAllReduce, Op::kBroadcast,
                      Op::kBarrier,   Op::kAllGather,     Op::kBarrier};
  ASSERT_EQ(heard.size(), 7u);
  for (size_t i = 0; i < heard.size(); ++i) {
    EXPECT_EQ(heard[i].seq, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(heard[i].op, order[i]) << i;
    EXPECT_TRUE(heard[i].ok);
  }
  EXPECT_TRUE(comm->status().ok());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NcclOneRank, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(at::toString(info.param)); });

// A host wait of zero on an op that cannot have finished (it waits behind a
// spinning kernel on the compute stream) aborts the communicator: the wait
// says DeadlineExceeded, status() keeps it, later calls fail with Aborted.
// Should the op still finish first (it cannot, short of a spin shorter than
// this host path), the abort path is not reached and the test fails.
TEST(NcclAbort, HostWaitTimeoutAbortsTheCommunicator) {
  c10::cuda::CUDAStream compute = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard on_compute(compute);
  NcclOptions o;
  o.compute_stream = compute.stream();
  auto recorder = std::make_shared<Recorder>();
  auto comm = Connect(o, recorder);
  ASSERT_NE(comm, nullptr);
  at::Tensor big = at::ones({64 << 20}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));  // 256 MiB
  at::cuda::sleep(kSpinCycles);
  auto w = comm->AllReduce(big);
  const absl::Status s = w->Wait(absl::ZeroDuration());
  // A 256 MiB all-reduce queued behind half a second of spinning cannot have
  // finished; if it did, the abort path went untested, and that is a failure.
  ASSERT_FALSE(s.ok()) << "the all-reduce finished before a zero host wait; abort path not reached";
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(s.message().rfind("[rank 0] all_reduce #1", 0), 0u) << s;
  EXPECT_TRUE(w->Done());
  EXPECT_EQ(comm->status().code(), absl::StatusCode::kDeadlineExceeded) << comm->status();

  at::Tensor in = at::zeros({4}, big.options()), out = at::zeros({4}, big.options());
  auto later = comm->AllGather(out, in);
  for (const absl::Status& l : {later->Wait(absl::Seconds(1)), later->WaitOnDevice(absl::Seconds(1))}) {
    EXPECT_EQ(l.code(), absl::StatusCode::kAborted) << l;
    EXPECT_NE(l.message().find("all_gather #2"), std::string::npos) << l;
    EXPECT_NE(l.message().find("all_reduce #1"), std::string::npos) << l;
  }
  const std::vector<Heard> heard = recorder->heard();
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0].op, Op::kAllReduce);
  EXPECT_FALSE(heard[0].ok);
  compute.synchronize();
}

// The watchdog bounds an op nobody waits for on the host: past op_timeout it
// aborts the communicator on its own.
TEST(NcclAbort, WatchdogTimesOutAnOp) {
  c10::cuda::CUDAStream compute = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard on_compute(compute);
  NcclOptions o;
  o.compute_stream = compute.stream();
  o.op_timeout = absl::Milliseconds(50);
  auto comm = Connect(o, std::make_shared<Recorder>());
  ASSERT_NE(comm, nullptr);
  at::Tensor x = at::ones({1024}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));
  at::cuda::sleep(kSpinCycles);
  auto w = comm->AllReduce(x);
  ASSERT_TRUE(w->WaitOnDevice(absl::Seconds(1)).ok());  // nothing known yet; the host does not wait
  ASSERT_TRUE(EventuallyDone(*w));
  ASSERT_FALSE(comm->status().ok()) << "the op finished within 50 ms despite the spinning kernel";
  EXPECT_EQ(comm->status().code(), absl::StatusCode::kDeadlineExceeded) << comm->status();
  EXPECT_EQ(comm->status().message().rfind("[rank 0] all_reduce #1", 0), 0u) << comm->status();
  EXPECT_EQ(w->Wait(absl::Seconds(1)).code(), absl::StatusCode::kDeadlineExceeded);
  compute.synchronize();
}

// --- two ranks, two processes ---------------------------------------------
//
// NCCL does not support ranks that are threads of one process on one GPU, so
// --two-ranks is a launcher: it serves a TCPStore and starts this program
// again as each rank (--rank R --store-port P), each with its own
// environment (TwoRankEnvironment), and waits for both within a deadline.

// The NCCL this process loaded (not torch's compile-time constant).
int LoadedNcclVersion() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? version : 0;
}

// Where each rank computes: its own GPU where there are two, else both on 0.
int TwoRankDevice(int rank) { return shardline::CudaDeviceCount() >= 2 ? rank : 0; }

// What rank `rank` adds to the environment, and how the two ranks meet:
// nothing on two GPUs; on one, NCCL_MULTI_RANK_GPU_ENABLE=1 where the loaded
// NCCL is 2.30 or later (its supported way); else (2.28, the wheel's pin)
// a host id of its own per rank, so that NCCL takes each rank for a host and
// connects them over sockets on loopback (it refuses two ranks of one host
// on one GPU): slow, but the same multi-rank code path.
std::vector<std::string> TwoRankEnvironment(int rank, std::string* how) {
  if (shardline::CudaDeviceCount() >= 2) {
    *how = "two GPUs";
    return {};
  }
  const int v = LoadedNcclVersion();
  if (v >= 23000) {
    *how = "one GPU, NCCL " + std::to_string(v) + " with NCCL_MULTI_RANK_GPU_ENABLE=1";
    return {"NCCL_MULTI_RANK_GPU_ENABLE=1"};
  }
  *how = "one GPU, NCCL " + std::to_string(v) + " with a host id per rank (sockets on loopback)";
  return {"NCCL_HOSTID=shardline-nccl-test-rank-" + std::to_string(rank), "NCCL_SOCKET_IFNAME=lo",
          "NCCL_IB_DISABLE=1"};
}

struct TwoRankArgs {
  int rank = -1;  // >= 0: this process is a rank the launcher started
  int store_port = 0;
};
TwoRankArgs g_two_ranks;

cudaStream_t RawStream(const shardline::Device& d, shardline::StreamRole role) {
  return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, d.stream(role)).stream();
}

// Each rank's collectives against their definitions, several in flight at
// once on the device's role streams, as the engine issues them; then
// MeasureLink (the rendezvous' bandwidth figure) over the same communicator.
std::string RunRank(const c10::intrusive_ptr<c10d::Store>& store, int rank) {
  const std::string spec = "cuda:" + std::to_string(TwoRankDevice(rank));
  if (absl::Status s = shardline::PrepareDevice(spec); !s.ok()) return std::string(s.message());
  auto opened = shardline::Device::Open(spec);
  if (!opened.ok()) return std::string(opened.status().message());
  const shardline::Device& device = **opened;
  shardline::Device::ComputeScope on_compute(device);
  NcclOptions o;
  o.device = device.device().index();
  o.compute_stream = RawStream(device, shardline::StreamRole::kCompute);
  o.all_gather_stream = RawStream(device, shardline::StreamRole::kAllGather);
  o.reduce_scatter_stream = RawStream(device, shardline::StreamRole::kReduceScatter);
  o.connect_timeout = o.op_timeout = absl::Seconds(60);
  auto made = CreateNcclCommunicator(store, "two", rank, 2, o);
  if (!made.ok()) return std::string(made.status().message());
  Communicator& comm = **made;
  const at::Device cuda = device.device();
  constexpr int64_t n = 1000;
  // all-reduce: (iota + 1) + (iota + 2); reduce-scatter: chunk `rank` of
  // (iota + 0) + (iota + 1); all-gather: [iota + 0, iota + 1].
  std::vector<at::Tensor> reduced;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 8; ++i) {  // back to back: the launches must not wait for each other
    reduced.push_back(Iota(n, rank + 1 + i).to(cuda));
    works.push_back(comm.AllReduce(reduced.back()));
  }
  at::Tensor rs_in = Iota(2 * n, rank).to(cuda), rs_out = at::zeros({n}, rs_in.options());
  works.push_back(comm.ReduceScatter(rs_out, rs_in));
  at::Tensor ag_in = Iota(n, rank).to(cuda), ag_out = at::zeros({2 * n}, ag_in.options());
  works.push_back(comm.AllGather(ag_out, ag_in));
  for (auto& w : works) {
    if (absl::Status s = w->Wait(absl::Seconds(60)); !s.ok()) return std::string(s.message());
  }
  for (int i = 0; i < 8; ++i) {
    if (!Host(reduced[i]).equal(Iota(n, 0) * 2 + (3 + 2 * i))) return "all_reduce #" + std::to_string(i + 1) + " differs";
  }
  if (!Host(rs_out).equal(Iota(2 * n, 0).narrow(0, rank * n, n) * 2 + 1)) return "reduce_scatter differs";
  if (!Host(ag_out).equal(at::cat({Iota(n, 0), Iota(n, 1)}))) return "all_gather differs";
  const CommStats stats = comm.Stats();
  if (stats.last_completed_seq != 10) return "last_completed_seq " + std::to_string(stats.last_completed_seq);
  // The ring formulas, per rank: all-gather and reduce-scatter send (n-1)/n of
  // the full buffer, all-reduce twice that.
  if (stats.of(Op::kAllGather).bytes_sent != RingAllGatherBytes(ag_out.nbytes(), 2) ||
      stats.of(Op::kReduceScatter).bytes_sent != RingReduceScatterBytes(rs_in.nbytes(), 2) ||
      stats.of(Op::kAllReduce).bytes_sent != 8 * RingAllReduceBytes(reduced[0].nbytes(), 4, 2)) {
    return "bytes sent differ from the ring formulas";
  }
  auto link = shardline::MeasureLink(comm, device, absl::Seconds(60));
  if (!link.ok()) return "MeasureLink: " + std::string(link.status().message());
  if (!(link->bus_bandwidth > 0)) return "MeasureLink gave no bandwidth";
  std::printf("PASS [rank %d] MeasureLink over NCCL: bus bandwidth %.3g GB/s\n", rank, link->bus_bandwidth / 1e9);
  return "";
}

TEST(NcclTwoRanks, NonBlockingCollectivesMatchTheirDefinitions) {
  ASSERT_GE(g_two_ranks.rank, 0) << "a rank of --two-ranks (the launcher starts it)";
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(g_two_ranks.store_port);
    so.isServer = false;
    so.timeout = std::chrono::seconds(60);
    store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  } catch (const std::exception& e) {
    FAIL() << "[rank " << g_two_ranks.rank << "] store: " << e.what();
  }
  EXPECT_EQ(RunRank(store, g_two_ranks.rank), "") << "rank " << g_two_ranks.rank;
}

// Serves the store, starts both ranks, waits for both (killing both past the
// deadline); 0 only if both passed.
int LaunchTwoRanks(const char* self) {
  constexpr int kDeadlineSeconds = 240;  // two NCCL inits over sockets and 13 small ops take seconds
  c10::intrusive_ptr<c10d::TCPStore> server;
  try {
    c10d::TCPStoreOptions so;
    so.port = 0;
    so.isServer = true;
    so.numWorkers = 3;  // the server's own client and both ranks
    so.waitWorkers = false;
    so.timeout = std::chrono::seconds(kDeadlineSeconds);
    server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  } catch (const std::exception& e) {
    std::printf("FAIL the launcher's store: %s\n", e.what());
    return 1;
  }
  const std::string port = std::to_string(server->getPort());
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    std::string how;
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    for (std::string& add : TwoRankEnvironment(r, &how)) env.push_back(std::move(add));
    if (r == 0) std::printf("two NCCL ranks as two processes: %s\n", how.c_str());
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string rank = std::to_string(r);
    std::string a0 = self, a1 = "--rank", a3 = "--store-port";
    char* argv[] = {a0.data(), a1.data(), rank.data(), a3.data(), const_cast<char*>(port.c_str()), nullptr};
    if (posix_spawn(&pids[r], "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) {
      std::printf("FAIL starting rank %d: %s\n", r, std::strerror(errno));
      if (r == 1) kill(pids[0], SIGKILL), waitpid(pids[0], nullptr, 0);
      return 1;
    }
  }
  int status[2] = {-1, -1};
  bool done[2] = {false, false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kDeadlineSeconds);
  while ((!done[0] || !done[1]) && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < 2; ++r) {
      if (!done[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) done[r] = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int failed = 0;
  for (int r = 0; r < 2; ++r) {
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      std::printf("FAIL rank %d did not finish within %d s\n", r, kDeadlineSeconds);
      failed = 1;
    } else if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
      std::printf("FAIL rank %d: %s %d\n", r, WIFEXITED(status[r]) ? "exit" : "signal",
                  WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : WTERMSIG(status[r]));
      failed = 1;
    }
  }
  if (!failed) std::printf("PASS two NCCL ranks in two processes\n");
  return failed;
}

}  // namespace
}  // namespace shardline::comm

//   nccl_test                  one rank: every test but NcclTwoRanks
//   nccl_test --two-ranks      two ranks in two processes (the launcher)
//   nccl_test --nccl-version   prints the loaded NCCL's version code (22809 is 2.28.9)
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--nccl-version") == 0) {
      std::printf("%d\n", shardline::comm::LoadedNcclVersion());
      return 0;
    }
  }
  if (shardline::CudaDeviceCount() == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  bool launch = false;
  auto& two = shardline::comm::g_two_ranks;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--two-ranks") == 0) launch = true;
    if (std::strcmp(argv[i], "--rank") == 0 && i + 1 < argc) two.rank = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--store-port") == 0 && i + 1 < argc) two.store_port = std::atoi(argv[++i]);
  }
  if (launch) return shardline::comm::LaunchTwoRanks(argv[0]);
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::GTEST_FLAG(filter) = two.rank >= 0 ? "NcclTwoRanks.*" : "-NcclTwoRanks.*";
  return RUN_ALL_TESTS();
}
