// checkpoint_bench: save and load throughput of one rank's sharded checkpoint
// beside `dd` of the same bytes on the same disk, and what an async save costs
// the step loop. The small GPT (6 x 512, block 256, vocab 16384) at N = 1 in
// fp32: the rank saves its fp32 parameters and Adam moments.
//
//   checkpoint_bench [--dir DIR] [--threads T]
// Page cache: every file is fsynced after writing and evicted
// (POSIX_FADV_DONTNEED) before it is read, so reads come from the disk.
// Checks itself: every load must give back, bitwise, the parameters and
// Adam moments that were saved (after a step that changed them).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/checkpoint/checkpoint.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double TimeCommand(const std::string& cmd) {
  const auto t = Clock::now();
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "checkpoint_bench: failed: %s\n", cmd.c_str());
  return Since(t);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardline;
  CLI::App app{"checkpoint_bench"};
  std::string dir = "/tmp/shardline-ckpt-bench";
  int threads = 2;
  app.add_option("--dir", dir);
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  std::system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir).c_str());

  JobConfig c;
  c.model = ModelConfig{"gpt2", 6, 8, 512, 16384, 256, ""};
  c.train.batch_size = c.train.micro_batch_size = 8;
  c.train.steps = 100;
  c.parallelism.strategy = Strategy::kNoShard;
  Communicators comms{comm::CreateSelfCommunicator(), comm::CreateSelfCommunicator()};
  auto engine = Engine::Create(c, 0, 1, *Device::Open("cpu"), std::move(comms));
  if (!engine.ok()) return Fail(engine.status());
  Engine& e = **engine;
  if (auto r = e.Step(0); !r.ok()) return Fail(r.status());

  const std::string step_dir = dir + "/step-00000001";
  absl::StatusOr<ShardSnapshot> first = SnapshotShards(e, false);
  if (!first.ok()) return Fail(first.status());
  const int64_t bytes = first->bytes();
  const double gb = bytes / 1e9;
  std::printf("# one rank's checkpoint: %.1f MB (fp32 params + Adam m, v of %.1fM parameters)\n", bytes / 1e6,
              bytes / 12.0 / 1e6);
  // Save (write + fsync + rename + SHA-256), three times, best.
  double save = 1e9;
  ManifestRankFile f;
  for (int i = 0; i < 3; ++i) {
    const auto t = Clock::now();
    auto w = SaveRankShards(e, step_dir, 1);
    if (!w.ok()) return Fail(w.status());
    save = std::min(save, Since(t));
    f = *w;
  }
  auto made = ManifestFor(e, c, 1);
  if (!made.ok()) return Fail(made.status());
  CheckpointManifest& m = *made;
  m.ranks.push_back(f);
  if (auto s = WriteManifestConfined(dir, m); !s.ok()) return Fail(s);
  // What was saved, to check every load against; then a step moves the
  // live state away from it, so that a load that read nothing would show.
  absl::StatusOr<ShardSnapshot> saved_or = SnapshotShards(e, /*copy=*/true);
  if (!saved_or.ok()) return Fail(saved_or.status());
  const ShardSnapshot& saved = *saved_or;
  if (auto r = e.Step(1); !r.ok()) return Fail(r.status());
  double load = 1e9;
  for (int i = 0; i < 3; ++i) {
    Evict(step_dir + "/" + f.file);
    const auto t = Clock::now();
    auto l = LoadCheckpoint(e, c, step_dir);
    if (!l.ok()) return Fail(l.status());
    load = std::min(load, Since(t));
    absl::StatusOr<ShardSnapshot> loaded_or = SnapshotShards(e, /*copy=*/false);
    if (!loaded_or.ok()) return Fail(loaded_or.status());
    const ShardSnapshot& loaded = *loaded_or;
    for (size_t u = 0; u < saved.shards.size(); ++u) {
      const Engine::ShardState &a = saved.shards[u], &b = loaded.shards[u];
      if (!a.master.equal(b.master) || !a.exp_avg.equal(b.exp_avg) || !a.exp_avg_sq.equal(b.exp_avg_sq)) {
        return Fail(absl::DataLossError(absl::StrCat("load ", i + 1, ": unit ", saved.units[u],
                                                     " is not what was saved")));
      }
    }
  }
  // dd of the same number of bytes, on the same disk.
  const std::string dd = dir + "/dd.bin";
  const long mib = static_cast<long>(bytes >> 20);
  double dd_write = 1e9, dd_read = 1e9;
  for (int i = 0; i < 3; ++i) {
    dd_write = std::min(dd_write, TimeCommand(absl::StrCat("dd if=/dev/zero of=", dd, " bs=1M count=", mib,
                                                           " conv=fsync status=none")));
    Evict(dd);
    dd_read = std::min(dd_read, TimeCommand(absl::StrCat("dd if=", dd, " of=/dev/null bs=1M status=none")));
  }
  const double dd_gb = mib * 1048576.0 / 1e9;
  std::printf("%-34s %8s %8s %10s\n", "operation", "seconds", "GB/s", "vs dd");
  std::printf("%-34s %8.3f %8.3f %9.0f%%\n", "save (write, fsync, sha256)", save, gb / save, (gb / save) / (dd_gb / dd_write) * 100);
  std::printf("%-34s %8.3f %8.3f %9.0f%%\n", "load (sha256 verify + read)", load, gb / load, (gb / load) / (dd_gb / dd_read) * 100);
  std::printf("%-34s %8.3f %8.3f %10s\n", "dd write (conv=fsync)", dd_write, dd_gb / dd_write, "");
  std::printf("%-34s %8.3f %8.3f %10s\n", "dd read (cache evicted)", dd_read, dd_gb / dd_read, "");

  // What an async save costs the step loop: the host copy, and the slowdown
  // of steps while the write runs beside them (they share this machine's cores).
  double plain = 0, overlapped = 0;
  // A step's error ends the bench with it (a failed step has no time).
  auto step_seconds = [&e](int s) -> absl::StatusOr<double> {
    SL_ASSIGN_OR_RETURN(StepResult r, e.Step(s));
    return r.seconds;
  };
  for (int s = 1; s <= 3; ++s) {
    absl::StatusOr<double> sec = step_seconds(s);
    if (!sec.ok()) return Fail(sec.status());
    plain += *sec;
  }
  auto t = Clock::now();
  absl::StatusOr<ShardSnapshot> snap_or = SnapshotShards(e, /*copy=*/true);
  if (!snap_or.ok()) return Fail(snap_or.status());
  const ShardSnapshot snap = *std::move(snap_or);
  const double copy = Since(t);
  absl::Status written;
  std::thread writer([&] { written = WriteRankShards(snap, dir + "/step-async", 4).status(); });
  t = Clock::now();
  absl::Status stepped;
  for (int s = 4; s <= 6 && stepped.ok(); ++s) {
    absl::StatusOr<double> sec = step_seconds(s);
    if (sec.ok()) overlapped += *sec;
    stepped = sec.status();
  }
  writer.join();
  if (!stepped.ok()) return Fail(stepped);
  if (!written.ok()) return Fail(written);
  std::printf("\n%-46s %8s\n", "step loop", "seconds");
  std::printf("%-46s %8.3f\n", "mean step, no save", plain / 3);
  std::printf("%-46s %8.3f\n", "sync save (the loop waits for all of it)", save);
  std::printf("%-46s %8.3f\n", "async save: host copy (the loop waits for this)", copy);
  std::printf("%-46s %8.3f\n", "mean step while the async write runs", overlapped / 3);
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  return 0;
}
