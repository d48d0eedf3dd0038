// control_plane_bench: one coordinator on loopback under a simulated fleet.
//
//   control_plane_bench [--workers 1000] [--jobs 100] [--job-workers 20] [--rendezvous-ranks 256]
//   control_plane_bench --queue 1000,10000
//
// Starts build/server/shardline-coordinator (heartbeats every 1 s), then:
//  1. connects --workers simulated workers (real WorkerSession streams over the
//     callback API, one process) that heartbeat at 1 Hz, and holds them idle;
//  2. submits --jobs jobs of --job-workers ranks each (more than the fleet
//     holds at once, so most queue); every simulated rank rendezvouses through
//     the coordinator's store as c10d's Gloo does (set its address, then a
//     blocking get of every peer's), reports progress twice and finishes;
//     meanwhile 10 watchers poll GetJob at 10 Hz, as `shardctl watch` would;
//  3. runs one job of --rendezvous-ranks ranks and times its rendezvous.
// Prints the coordinator's CPU use per phase (from /proc) and the p50/p99 of
// every RPC as the clients saw it. Checks itself: every job must SUCCEED.
//
// With --queue, instead: no workers at all, and jobs of 4 ranks submitted by 4
// client threads until each given number waits in the queue (a queue that
// cannot start, which every scheduling event looks at). For each size it
// prints the submit rate of the last 1,000 submits, the idle coordinator's
// CPU over 10 s, and the time to list every job a page of 1,000 at a time.
// Checks itself: every submit is accepted and the listing holds every job.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <condition_variable>
#include <set>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "shardline/v1/shardline.grpc.pb.h"

namespace sl = shardline::v1;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Latencies per RPC method, as the clients saw them.
class Latencies {
 public:
  void Add(const std::string& method, double s) {
    std::lock_guard<std::mutex> l(mu_);
    by_[method].push_back(s);
  }
  void Print() {
    std::lock_guard<std::mutex> l(mu_);
    std::printf("%-12s %9s %10s %10s %10s\n", "rpc", "calls", "p50_ms", "p99_ms", "max_ms");
    for (auto& [m, v] : by_) {
      std::sort(v.begin(), v.end());
      auto q = [&](double f) { return v[std::min(v.size() - 1, static_cast<size_t>(f * v.size()))] * 1e3; };
      std::printf("%-12s %9zu %10.3f %10.3f %10.3f\n", m.c_str(), v.size(), q(0.5), q(0.99), v.back() * 1e3);
    }
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<double>> by_;
};

Latencies g_lat;

template <typename Fn>
grpc::Status Timed(const std::string& method, Fn fn) {
  const auto t0 = Clock::now();
  grpc::Status s = fn();
  g_lat.Add(method, Since(t0));
  return s;
}

double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream in(s.substr(s.rfind(')') + 2));
  std::string field;
  double ut = 0, st = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) ut = std::stod(field);
    if (i == 15) st = std::stod(field);
  }
  return (ut + st) / sysconf(_SC_CLK_TCK);
}

class Fleet;

// One simulated worker: a real session stream; writes are queued, one in
// flight, as the callback API requires.
class SimWorker : public grpc::ClientBidiReactor<sl::WorkerMessage, sl::CoordinatorMessage> {
 public:
  SimWorker(Fleet* fleet, sl::Coordinator::Stub* stub, int index);
  void Send(const sl::WorkerMessage& m) {
    std::lock_guard<std::mutex> l(mu_);
    if (done_) return;
    out_.push_back(m);
    if (out_.size() == 1) StartWrite(&out_.front());
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    out_.pop_front();
    if (ok && !out_.empty()) StartWrite(&out_.front());
  }
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
  }
  void Stop() { ctx_.TryCancel(); }
  int index() const { return index_; }

 private:
  Fleet* const fleet_;
  const int index_;
  grpc::ClientContext ctx_;
  sl::CoordinatorMessage in_;
  std::mutex mu_;
  std::deque<sl::WorkerMessage> out_;
  bool done_ = false;
};

class Fleet {
 public:
  explicit Fleet(std::shared_ptr<grpc::Channel> ch) : stub_(sl::Coordinator::NewStub(ch)) {}
  // `max_ranks`: the largest job; each of its ranks needs a thread, since a
  // rank blocks in the store until every peer has set its key.
  void Connect(int n, int max_ranks) {
    for (int i = 0; i < n; ++i) workers_.push_back(std::make_unique<SimWorker>(this, stub_.get(), i));
    for (int i = 0; i < max_ranks + 16; ++i) pool_.emplace_back([this] { RankLoop(); });
    ticker_ = std::thread([this] { Heartbeats(); });
  }
  void Shutdown() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : pool_) t.join();
    if (ticker_.joinable()) ticker_.join();  // not started without Connect
    for (auto& w : workers_) w->Stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  void OnStart(SimWorker* w, const sl::Assignment& a) {
    {
      std::lock_guard<std::mutex> l(mu_);
      starts_.push_back({w, a});
      auto& first = first_start_[a.job_id()];
      if (first == Clock::time_point()) first = Clock::now();
    }
    cv_.notify_one();
  }
  // Seconds from the job's first Start to its last rank's rendezvous.
  double RendezvousSeconds(const std::string& job) {
    std::lock_guard<std::mutex> l(mu_);
    return std::chrono::duration<double>(last_connected_[job] - first_start_[job]).count();
  }
  sl::Coordinator::Stub* stub() { return stub_.get(); }

 private:
  struct Start {
    SimWorker* w;
    sl::Assignment a;
  };
  // A rank: c10d Gloo's rendezvous through the store, then a short "run".
  void RankLoop() {
    for (;;) {
      Start s;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stopping_ || !starts_.empty(); });
        if (stopping_) return;
        s = starts_.front();
        starts_.pop_front();
      }
      const std::string prefix = s.a.job_id() + "/rank_";
      auto call = [&](auto fn) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
        ctx.AddMetadata("x-shardline-credential", s.a.credential());
        return fn(&ctx);
      };
      call([&](grpc::ClientContext* ctx) {
        sl::StoreSetRequest r;
        r.set_key(prefix + std::to_string(s.a.rank()));
        r.set_value(std::string(64, 'a'));  // a pair address
        sl::StoreSetResponse resp;
        return Timed("StoreSet", [&] { return stub_->StoreSet(ctx, r, &resp); });
      });
      for (int q = 0; q < s.a.world_size(); ++q) {
        if (q == s.a.rank()) continue;
        call([&](grpc::ClientContext* ctx) {
          sl::StoreGetRequest r;
          r.set_key(prefix + std::to_string(q));
          r.set_timeout_ms(100000);
          sl::StoreGetResponse resp;
          return Timed("StoreGet", [&] { return stub_->StoreGet(ctx, r, &resp); });
        });
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        last_connected_[s.a.job_id()] = Clock::now();
      }
      sl::WorkerMessage m;
      m.mutable_connected()->set_job_id(s.a.job_id());
      m.mutable_connected()->set_rank(s.a.rank());
      s.w->Send(m);
      for (int step = 1; step <= 2; ++step) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        sl::WorkerMessage p;
        p.mutable_progress()->set_job_id(s.a.job_id());
        p.mutable_progress()->set_rank(s.a.rank());
        p.mutable_progress()->set_step(step);
        p.mutable_progress()->set_loss(5.0 / step);
        s.w->Send(p);
      }
      sl::WorkerMessage f;
      f.mutable_finished()->set_job_id(s.a.job_id());
      f.mutable_finished()->set_rank(s.a.rank());
      f.mutable_finished()->set_ok(true);
      s.w->Send(f);
    }
  }
  // 1 Hz per worker, spread evenly over the second.
  void Heartbeats() {
    int64_t step = 0;
    while (true) {
      for (auto& w : workers_) {
        {
          std::lock_guard<std::mutex> l(mu_);
          if (stopping_) return;
        }
        sl::WorkerMessage m;
        m.mutable_heartbeat()->set_step(step);
        w->Send(m);
        std::this_thread::sleep_for(std::chrono::microseconds(1000000 / workers_.size()));
      }
      ++step;
    }
  }

  std::unique_ptr<sl::Coordinator::Stub> stub_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  std::vector<std::thread> pool_;
  std::thread ticker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Start> starts_;
  bool stopping_ = false;
  std::map<std::string, Clock::time_point> first_start_, last_connected_;
};

SimWorker::SimWorker(Fleet* fleet, sl::Coordinator::Stub* stub, int index) : fleet_(fleet), index_(index) {
  stub->async()->WorkerSession(&ctx_, this);
  sl::WorkerMessage reg;
  reg.mutable_register_()->set_host("sim-" + std::to_string(index / 8));
  reg.mutable_register_()->set_device("cuda:" + std::to_string(index % 8));
  reg.mutable_register_()->set_memory_bytes(int64_t{80} << 30);
  Send(reg);
  StartRead(&in_);
  StartCall();
}

void SimWorker::OnReadDone(bool ok) {
  if (!ok) return;
  if (in_.has_start()) fleet_->OnStart(this, in_.start());
  StartRead(&in_);
}

std::string SubmitJob(sl::Coordinator::Stub* stub, int workers) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  sl::SubmitJobRequest r;
  r.set_spec_toml("[model]\nn_layer = 2\nn_head = 2\nn_embd = 16\nvocab_size = 64\nblock_size = 8\n"
                  "[train]\nsteps = 2\nbatch_size = " + std::to_string(2 * workers) + "\nmicro_batch_size = 1\n");
  r.set_workers(workers);
  sl::SubmitJobResponse resp;
  grpc::Status s = Timed("SubmitJob", [&] { return stub->SubmitJob(&ctx, r, &resp); });
  if (!s.ok()) {
    std::cerr << "control_plane_bench: submit failed: " << s.error_message() << std::endl;
    std::exit(1);
  }
  return resp.job_id();
}

sl::Job GetJob(sl::Coordinator::Stub* stub, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  sl::GetJobRequest r;
  r.set_job_id(id);
  sl::Job j;
  (void)Timed("GetJob", [&] { return stub->GetJob(&ctx, r, &j); });
  return j;
}

int CountWorkers(sl::Coordinator::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  sl::ListWorkersResponse resp;
  (void)Timed("ListWorkers", [&] { return stub->ListWorkers(&ctx, sl::ListWorkersRequest(), &resp); });
  return resp.workers_size();
}

// Waits until every job ended; false (and a message) if one did not succeed
// or the deadline passed.
bool WaitJobs(sl::Coordinator::Stub* stub, const std::vector<std::string>& ids, double timeout_s) {
  const auto t0 = Clock::now();
  std::set<std::string> open(ids.begin(), ids.end());
  while (!open.empty()) {
    if (Since(t0) > timeout_s) {
      std::cerr << "control_plane_bench: " << open.size() << " jobs still open after " << timeout_s << " s"
                << std::endl;
      return false;
    }
    for (auto it = open.begin(); it != open.end();) {
      const sl::Job j = GetJob(stub, *it);
      if (j.state() == shardline::v1::JOB_STATE_SUCCEEDED) {
        it = open.erase(it);
      } else if (j.state() == shardline::v1::JOB_STATE_FAILED || j.state() == shardline::v1::JOB_STATE_CANCELLED) {
        std::cerr << "control_plane_bench: " << *it << " " << shardline::v1::JobState_Name(j.state()) << ": " << j.message() << std::endl;
        return false;
      } else {
        ++it;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return true;
}

}  // namespace

// Every job, through ListJobs pages of 1,000; -1 if a page fails.
int64_t ListAllJobs(sl::Coordinator::Stub* stub) {
  int64_t n = 0;
  std::string token;
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    sl::ListJobsRequest r;
    r.set_page_size(1000);
    r.set_page_token(token);
    sl::ListJobsResponse resp;
    if (!Timed("ListJobs", [&] { return stub->ListJobs(&ctx, r, &resp); }).ok()) return -1;
    n += resp.jobs_size();
    token = resp.next_page_token();
  } while (!token.empty());
  return n;
}

// The --queue table (see the top of the file).
bool QueueScaling(sl::Coordinator::Stub* stub, pid_t pid, const std::vector<int>& sizes) {
  std::printf("%-8s %12s %14s %12s\n", "queued", "submits/s", "idle_cpu_%", "list_all_s");
  int queued = 0;
  for (int size : sizes) {
    const int timed_from = std::max(queued, size - 1000);
    auto submit_until = [&](int n) {
      std::atomic<int> next{queued};
      std::vector<std::thread> clients;
      for (int t = 0; t < 4; ++t) {
        clients.emplace_back([&] {
          while (next.fetch_add(1) < n) (void)SubmitJob(stub, 4);
        });
      }
      for (auto& c : clients) c.join();
      queued = n;
    };
    submit_until(timed_from);
    const auto t0 = Clock::now();
    submit_until(size);
    const double rate = (size - timed_from) / Since(t0);
    const double c0 = CpuSeconds(pid);
    const auto t1 = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(10));
    const double idle = 100 * (CpuSeconds(pid) - c0) / Since(t1);
    const auto t2 = Clock::now();
    const int64_t listed = ListAllJobs(stub);
    const double list_s = Since(t2);
    std::printf("%-8d %12.0f %13.1f%% %12.3f\n", size, rate, idle, list_s);
    std::fflush(stdout);
    if (listed != size) {
      std::cerr << "control_plane_bench: listed " << listed << " jobs of " << size << std::endl;
      return false;
    }
  }
  return true;
}

// n jobs of `ranks` each, run to the end while 10 clients watch them.
bool ManyJobsWatched(sl::Coordinator::Stub* stub, int n, int ranks) {
  std::vector<std::string> ids;
  for (int j = 0; j < n; ++j) ids.push_back(SubmitJob(stub, ranks));
  std::atomic<bool> watching{true};
  std::vector<std::thread> watchers;
  for (int w = 0; w < 10; ++w) {
    watchers.emplace_back([&, w] {
      while (watching) {
        (void)GetJob(stub, ids[w * ids.size() / 10]);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  const bool done = WaitJobs(stub, ids, 600);
  watching = false;
  for (auto& t : watchers) t.join();
  return done;
}

// A coordinator of its own, started from this build: its pid, its address
// and the folder of its state and logs.
struct Coordinator {
  pid_t pid = 0;
  std::string addr, dir;
};

bool StartCoordinator(Coordinator* c) {
  char self[4096] = {0};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return false;
  const std::string build = std::string(self).substr(0, std::string(self).rfind("/bench/"));
  char tmpl[] = "/tmp/control-plane-bench-XXXXXX";
  c->dir = mkdtemp(tmpl);
  const std::string out = c->dir + "/coordinator.out";
  const std::string cmd = build + "/server/shardline-coordinator --listen 127.0.0.1:0 --state-dir " + c->dir +
                          "/state --heartbeat-ms 1000 > " + out + " 2> " + c->dir + "/coordinator.log & echo $!";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  const bool started = fscanf(p, "%d", &c->pid) == 1;
  pclose(p);
  if (!started) return false;
  for (int i = 0; i < 100 && c->addr.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream f(out);
    std::string word;
    if (f >> word >> word >> c->addr) break;
    c->addr.clear();
  }
  return !c->addr.empty();
}

struct Sizes {
  int n_workers = 1000, n_jobs = 100, job_workers = 20, rdzv_ranks = 256;
};

// The fleet's phases, one table row each: connect, idle, many jobs with
// watchers, one large rendezvous.
bool RunPhases(Fleet& fleet, pid_t pid, const Sizes& z) {
  auto* stub = fleet.stub();
  std::printf("%-44s %10s %10s %9s\n", "phase", "wall_s", "coord_cpu_s", "cpu_%");
  auto phase = [&](const char* name, const std::function<bool()>& fn) {
    const double c0 = CpuSeconds(pid);
    const auto t0 = Clock::now();
    const bool ok = fn();
    const double wall = Since(t0), cpu = CpuSeconds(pid) - c0;
    std::printf("%-44s %10.2f %10.2f %8.1f%%\n", name, wall, cpu, 100 * cpu / wall);
    std::fflush(stdout);
    return ok;
  };
  bool ok = phase(("connect " + std::to_string(z.n_workers) + " workers").c_str(), [&] {
    fleet.Connect(z.n_workers, std::max(z.rdzv_ranks, z.job_workers));
    const auto t0 = Clock::now();
    while (CountWorkers(stub) < z.n_workers) {
      if (Since(t0) > 60) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return true;
  });
  ok = ok && phase("idle fleet, heartbeats at 1 Hz, 10 s", [&] {
    for (int i = 0; i < 100; ++i) {
      (void)CountWorkers(stub);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return true;
  });
  const std::string many = std::to_string(z.n_jobs) + " jobs x " + std::to_string(z.job_workers) + " ranks, 10 watchers";
  ok = ok && phase(many.c_str(), [&] { return ManyJobsWatched(stub, z.n_jobs, z.job_workers); });
  std::string big;
  ok = ok && phase(("one job of " + std::to_string(z.rdzv_ranks) + " ranks").c_str(), [&] {
    big = SubmitJob(stub, z.rdzv_ranks);
    return WaitJobs(stub, {big}, 600);
  });
  if (ok) {
    std::printf("\nrendezvous of %d ranks (first Start to last rank connected, %d store RPCs): %.2f s\n\n",
                z.rdzv_ranks, z.rdzv_ranks * z.rdzv_ranks, fleet.RendezvousSeconds(big));
  }
  return ok;
}

int main(int argc, char** argv) {
  CLI::App app{"control_plane_bench"};
  Sizes z;
  std::vector<int> queue_sizes;
  app.add_option("--workers", z.n_workers);
  app.add_option("--jobs", z.n_jobs);
  app.add_option("--job-workers", z.job_workers);
  app.add_option("--rendezvous-ranks", z.rdzv_ranks);
  app.add_option("--queue", queue_sizes, "queue sizes to measure, ascending, at most 10000 (the default limit)")
      ->delimiter(',')
      ->check(CLI::Range(1, 10000));
  CLI11_PARSE(app, argc, argv);

  Coordinator c;
  if (!StartCoordinator(&c)) {
    std::cerr << "control_plane_bench: the coordinator did not start" << std::endl;
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  Fleet fleet(grpc::CreateCustomChannel(c.addr, grpc::InsecureChannelCredentials(), args));
  std::printf("# one coordinator (pid %d) on loopback, %u cores here; the simulated fleet runs in this process\n",
              c.pid, std::thread::hardware_concurrency());
  bool ok;
  if (!queue_sizes.empty()) {
    ok = QueueScaling(fleet.stub(), c.pid, queue_sizes);
  } else {
    ok = RunPhases(fleet, c.pid, z);
    g_lat.Print();
  }
  fleet.Shutdown();
  kill(c.pid, SIGTERM);
  if (!ok) std::cerr << "control_plane_bench: FAILED (coordinator log in " << c.dir << ")" << std::endl;
  return ok ? 0 : 1;
}
