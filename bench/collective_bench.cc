// collective_bench: all-gather, reduce-scatter and all-reduce through the
// Communicator (Gloo rings), beside the raw c10d Gloo call and a memcpy of the
// same bytes, with algbw and busbw as nccl-tests defines them:
//   algbw = S / t   (S: the full buffer, i.e. all-gather output / reduce-scatter input)
//   busbw = algbw * (n-1)/n  (all-gather, reduce-scatter),  * 2(n-1)/n  (all-reduce)
// Every call's status is checked, and after each op's timing one more call of
// ours is checked whole against the known answer (nccl-tests' -c 1): every
// all-gather chunk in its place, every reduced element at its position.
//
//   collective_bench --world N [--min-bytes B] [--max-bytes B] [--threads T] [--rounds R]
//                    [--iters I] [--ops all_gather,reduce_scatter,all_reduce]
// Rank 0 spawns the other ranks as processes (this same binary) and prints.
// Across hosts, the caller starts every rank itself, one per host:
//   collective_bench --launched --world N --rank R --master ADDR0 --port P --hostname ADDR_R ...
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <iostream>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/comm/gloo_communicator.h"

extern char** environ;

namespace shardline::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int world = 2, rank = 0, port = 0, threads = 1;
  int64_t min_bytes = 1 << 10, max_bytes = int64_t{256} << 20;
  int rounds = 3;
  int iters = 0;  // timed calls per measurement; 0: 256 MiB worth, 3 to 200
  std::string ops = "all_gather,reduce_scatter,all_reduce";
  bool launched = false;               // every rank started by the caller
  std::string master = "127.0.0.1";    // rank 0's address: the store
  std::string hostname = "127.0.0.1";  // this rank's address: its Gloo pairs
};

bool Wants(const Flags& f, const std::string& op) {
  return absl::StrContains(absl::StrCat(",", f.ops, ","), absl::StrCat(",", op, ","));
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Runs fn `iters` times after 2 warm-ups, returns seconds per call (the
// slowest rank's, via a max all-reduce, as nccl-tests reports).
double TimeIt(c10d::ProcessGroupGloo& pg, int iters, const std::function<void()>& fn) {
  fn();
  fn();
  pg.barrier()->wait();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  double t = Seconds(t0, Clock::now()) / iters;
  std::vector<at::Tensor> v{at::full({1}, t, at::kDouble)};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  pg.allreduce(v, o)->wait();
  return v[0].item<double>();
}

void Check(bool ok, const char* what, int64_t bytes) {
  if (!ok) {
    std::cerr << "collective_bench: wrong result for " << what << " at " << bytes << " bytes" << std::endl;
    std::exit(2);
  }
}

// Every timed call's own status: a collective that failed is no timing.
void Must(const absl::Status& s, const char* what, int64_t bytes) {
  if (!s.ok()) {
    std::cerr << "collective_bench: " << what << " at " << bytes << " bytes failed: " << s << std::endl;
    std::exit(2);
  }
}

// Rank r's input for the reduce checks: element i is (i mod 1024) + r, so
// every element of a sum over n ranks, n * (i mod 1024) + n(n-1)/2, is exact
// in fp32 and tells each position from the others.
at::Tensor ReduceInput(int64_t elems, int r) { return at::arange(elems).remainder(1024).to(at::kFloat) + r; }
at::Tensor ReduceSum(int64_t first, int64_t count, int n) {
  return at::arange(first, first + count).remainder(1024).to(at::kFloat) * n + n * (n - 1) / 2.0f;
}

// Rank 0 starts ranks 1..N-1 as copies of this program on the store's port;
// false where one cannot be started.
bool SpawnRanks(const Flags& f, int port_number, std::vector<pid_t>* children) {
  const std::string port = std::to_string(port_number);
  const std::string world = std::to_string(f.world), threads = std::to_string(f.threads);
  const std::string lo = std::to_string(f.min_bytes), hi = std::to_string(f.max_bytes);
  const std::string rounds = std::to_string(f.rounds), iters = std::to_string(f.iters);
  for (int r = 1; r < f.world; ++r) {
    const std::string rank = std::to_string(r);
    std::vector<const char*> argv = {"/proc/self/exe", "--world", world.c_str(), "--rank", rank.c_str(),
                                     "--port", port.c_str(), "--threads", threads.c_str(),
                                     "--min-bytes", lo.c_str(), "--max-bytes", hi.c_str(),
                                     "--rounds", rounds.c_str(), "--iters", iters.c_str(),
                                     "--ops", f.ops.c_str(), nullptr};
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, const_cast<char**>(argv.data()), environ) != 0) {
      std::cerr << "collective_bench: cannot spawn rank " << r << std::endl;
      return false;
    }
    children->push_back(pid);
  }
  return true;
}

// One row per collective at `bytes`: ours and c10d's Gloo, timed in
// alternation; ours then checked against its definition.
void MeasureSize(comm::Communicator& comm, c10d::ProcessGroupGloo& raw, const Flags& f, int64_t bytes) {
  const int n = f.world, r = f.rank;
  const int64_t elems = bytes / 4 / n * n;  // fp32, divisible by n
  const int64_t S = elems * 4;
  const int iters = f.iters > 0 ? f.iters
                                 : std::max<int64_t>(3, std::min<int64_t>(200, (int64_t{256} << 20) / std::max<int64_t>(S, 1)));
  at::Tensor full = at::empty({elems}), chunk = at::full({elems / n}, r + 1.0f);
  at::Tensor src = at::ones({elems}), dst = at::empty({elems});
  auto memcpy_t = TimeIt(raw, iters, [&] { std::memcpy(dst.data_ptr(), src.data_ptr(), S); });
  const double mcpy = S / memcpy_t / 1e9;
  auto row = [&](const char* op, double t, double factor, double raw_t) {
    if (r != 0) return;
    const double algbw = S / t / 1e9, busbw = algbw * factor;
    std::printf("%-15s %10ld %10.1f %9.3f %9.3f %10.1f %9.3f %8.1f%% %11.2f %7.1f%%\n", op, S, t * 1e6, algbw,
                busbw, raw_t * 1e6, S / raw_t / 1e9 * factor, (t / raw_t - 1) * 100, mcpy, busbw / mcpy * 100);
  };
  const double ring = double(n - 1) / n;
  // Ours and raw alternate for `rounds` rounds and each keeps its best: on a
  // shared VM that compares the two under the same background, not drift.
  auto best_of = [&](const std::function<void()>& ours, const std::function<void()>& theirs) {
    double t = 1e30, rt = 1e30;
    for (int k = 0; k < f.rounds; ++k) {
      t = std::min(t, TimeIt(raw, iters, ours));
      rt = std::min(rt, TimeIt(raw, iters, theirs));
    }
    return std::make_pair(t, rt);
  };
  // all-gather (the raw call writes its own buffer; ours is checked after
  // a last call of its own, every rank's chunk in its place)
  const int64_t c = elems / n;
  double t = 0, rt = 0;
  if (Wants(f, "all_gather")) {
  at::Tensor raw_ag = at::empty({elems});
  std::vector<std::vector<at::Tensor>> ag_out{raw_ag.chunk(n)};
  std::vector<at::Tensor> ag_in{chunk};
  std::tie(t, rt) = best_of([&] { Must(comm.AllGather(full, chunk)->Wait(absl::Seconds(60)), "all_gather", S); },
                            [&] { raw.allgather(ag_out, ag_in)->wait(); });
  full.fill_(-1.0f);
  Must(comm.AllGather(full, chunk)->Wait(absl::Seconds(60)), "all_gather", S);
  Check(full.view({n, c}).eq(at::arange(1, n + 1).to(at::kFloat).unsqueeze(1)).all().item<bool>(), "all_gather", S);
  row("all_gather", t, ring, rt);
  }
  if (Wants(f, "reduce_scatter")) {
  // reduce-scatter (input is scratch, so it is refilled each call; the raw
  // c10d Gloo call is an all-reduce of the whole input followed by a slice)
  at::Tensor rs_out = at::empty({c}), raw_rs_out = at::empty({c});
  std::tie(t, rt) = best_of(
      [&] {
        full.fill_(1.0f);
        Must(comm.ReduceScatter(rs_out, full)->Wait(absl::Seconds(60)), "reduce_scatter", S);
      },
      [&] {
        full.fill_(1.0f);
        raw._reduce_scatter_base(raw_rs_out, full)->wait();
      });
  full.copy_(ReduceInput(elems, r));
  rs_out.fill_(-1.0f);
  Must(comm.ReduceScatter(rs_out, full)->Wait(absl::Seconds(60)), "reduce_scatter", S);
  Check(rs_out.equal(ReduceSum(r * c, c, n)), "reduce_scatter", S);
  row("reduce_scatter", t, ring, rt);
  }
  if (!Wants(f, "all_reduce")) return;
  // all-reduce
  at::Tensor raw_full = at::empty({elems});
  std::vector<at::Tensor> ar{raw_full};
  std::tie(t, rt) = best_of(
      [&] {
        full.fill_(1.0f);
        Must(comm.AllReduce(full)->Wait(absl::Seconds(60)), "all_reduce", S);
      },
      [&] {
        raw_full.fill_(1.0f);
        raw.allreduce(ar)->wait();
      });
  full.copy_(ReduceInput(elems, r));
  Must(comm.AllReduce(full)->Wait(absl::Seconds(60)), "all_reduce", S);
  Check(full.equal(ReduceSum(0, elems, n)), "all_reduce", S);
  row("all_reduce", t, 2 * ring, rt);
}

int Run(const Flags& f) {
  at::set_num_threads(f.threads);
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(f.port);
  so.isServer = f.rank == 0;
  so.numWorkers = f.world;
  so.waitWorkers = false;
  auto store = c10::make_intrusive<c10d::TCPStore>(f.master, so);
  std::vector<pid_t> children;
  if (f.rank == 0 && !f.launched && !SpawnRanks(f, store->getPort(), &children)) return 1;
  const int n = f.world, r = f.rank;
  comm::GlooOptions gloo;
  gloo.hostname = f.hostname;
  auto comm = comm::CreateGlooCommunicator(store, "comm/", r, n, gloo);
  if (!comm.ok()) {
    std::cerr << comm.status() << std::endl;
    return 1;
  }
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(f.hostname));
  c10d::ProcessGroupGloo raw(c10::make_intrusive<c10d::PrefixStore>("raw/", store), r, n, opts);
  if (r == 0) {
    std::printf("# N=%d ranks (processes) %s, %d intra-op thread(s) each; times are the slowest rank's\n", n,
                f.launched ? "started by the caller" : "on loopback", f.threads);
    std::printf("%-15s %10s %10s %9s %9s %10s %9s %9s %11s %8s\n", "op", "bytes", "time_us", "algbw", "busbw",
                "raw_us", "raw_busbw", "overhead", "memcpy_GBs", "bus/mcpy");
  }
  for (int64_t bytes = f.min_bytes; bytes <= f.max_bytes; bytes *= 4) MeasureSize(**comm, raw, f, bytes);
  for (pid_t pid : children) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  CLI::App app{"collective_bench"};
  shardline::bench::Flags f;
  app.add_option("--world", f.world);
  app.add_option("--rank", f.rank);
  app.add_option("--port", f.port);
  app.add_option("--threads", f.threads);
  app.add_option("--min-bytes", f.min_bytes);
  app.add_option("--max-bytes", f.max_bytes);
  app.add_option("--rounds", f.rounds, "alternate ours and raw this many times, keep each one's best");
  app.add_option("--iters", f.iters, "timed calls per measurement (default: 256 MiB worth, 3 to 200)");
  app.add_option("--ops", f.ops, "comma-separated: all_gather, reduce_scatter, all_reduce");
  app.add_flag("--launched", f.launched, "every rank is started by the caller (one per host); rank 0 spawns none");
  app.add_option("--master", f.master, "rank 0's address (the store)");
  app.add_option("--hostname", f.hostname, "this rank's address (its Gloo connections)");
  CLI11_PARSE(app, argc, argv);
  return shardline::bench::Run(f);
}
