// What the coordinator core's unit tests share: a WorkerChannel that records
// what the core sent, a small job, and a core over a fresh state store.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint/checkpoint_manifest.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"

namespace shardline::testing_core {

// The session as the core sees it: what was sent, and whether it was closed.
class RecordingChannel : public WorkerChannel {
 public:
  void Send(const v1::CoordinatorMessage& m) override { sent.push_back(m); }
  void Close(const absl::Status& why) override { closed = why; }
  std::vector<v1::Assignment> Starts() const {
    std::vector<v1::Assignment> out;
    for (const auto& m : sent) if (m.has_start()) out.push_back(m.start());
    return out;
  }
  int Cancels() const {
    int n = 0;
    for (const auto& m : sent) n += m.has_cancel();
    return n;
  }
  std::vector<v1::CoordinatorMessage> sent;
  absl::Status closed;
};

// A job file of the tests' tiny model (batch 12, micro-batch 1): `job` is
// the [job] table's lines, `extra` more tables after [train].
inline std::string TinySpec(const std::string& job, int steps, const std::string& extra = "") {
  return "[job]\n" + job + "\n[model]\nn_layer = 1\nn_head = 2\nn_embd = 8\nvocab_size = 16\nblock_size = 4\n" +
         "[train]\nsteps = " + std::to_string(steps) + "\nbatch_size = 12\nmicro_batch_size = 1\n" + extra;
}

// Without restarts, so that a failure is final (the restart tests use
// kRestartSpec).
inline const std::string kSpec = TinySpec("max_restarts = 0", 5);

class CoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/core-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    store_ = *StateStore::Open(dir_);
    core_ = std::make_unique<CoordinatorCore>(store_.get(),
                                             CoordinatorOptions{absl::Milliseconds(100), 3, absl::Milliseconds(50), absl::Milliseconds(50)});
  }
  // The core before its store, the store (SQLite) before its directory.
  void TearDown() override {
    core_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  // memory_bytes: what strategy = "auto" plans with (0: nothing fits).
  // address: the collective address it registers (empty: none).
  std::string AddWorker(const std::string& host, const std::string& device, RecordingChannel* ch,
                        int64_t memory_bytes = 0, const std::string& address = "") {
    v1::WorkerInfo info;
    info.set_host(host);
    info.set_device(device);
    info.set_memory_bytes(memory_bytes);
    info.set_collective_address(address);
    return core_->RegisterWorker(info, ch)->worker_id();
  }
  std::string Submit(int workers) {
    v1::SubmitJobRequest r;
    r.set_spec_toml(kSpec);
    r.set_workers(workers);
    auto id = core_->Submit(r);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }
  // `code` 0: a worker that does not say what kind of error it had.
  void Finish(const std::string& worker, const std::string& job, int rank, bool ok, const std::string& msg = "",
              absl::StatusCode code = absl::StatusCode::kOk) {
    v1::RankFinished f;
    f.set_job_id(job);
    f.set_rank(rank);
    f.set_ok(ok);
    f.set_message(msg);
    f.set_code(static_cast<int>(code));
    core_->OnFinished(worker, f);
  }
  std::string State(const std::string& job) { return JobStateName(core_->GetJob(job)->state()); }
  // The report of assignment `a`'s own file of `step` under the job's
  // checkpoint root (its step directory made), as a rank sends it.
  v1::CheckpointReport ReportOf(const std::string& job, const v1::Assignment& a, int64_t step) {
    const std::string root = core_->GetJob(job)->checkpoint_root();
    std::filesystem::create_directories(root + "/" + StepDirName(step));
    v1::CheckpointReport r;
    r.set_job_id(job);
    r.set_rank(a.rank());
    r.set_step(step);
    r.set_path(RankFilePath(root, step, a.rank(), a.attempt()));
    r.set_size_bytes(10);
    r.set_checksum(std::string(64, 'a'));
    return r;
  }

  std::string dir_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<CoordinatorCore> core_;
};

}  // namespace shardline::testing_core
