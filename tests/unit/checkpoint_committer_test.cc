// CheckpointCommitter alone: which reports it takes, the order of a commit
// (record, then manifest, then prune), keep_latest keeping the newest steps,
// and which step directories count as interrupted saves.
#include "server/checkpoint_committer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/checkpoint/checkpoint_manifest.h"
#include "common/spec/job_spec.h"
#include "tests/unit/core_fixture.h"

namespace shardline {
namespace {

namespace fs = std::filesystem;

class CommitterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/committer-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    root_ = dir_ + "/ckpt/job-1";
    fs::create_directories(root_);
    auto cfg = ResolveJobSpec(testing_core::TinySpec("", 10, "[checkpoint]\nkeep_latest = 2\n"), "job", dir_);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    config_ = *cfg;
    job_.set_id("job-1");
    job_.set_state(v1::JOB_STATE_RUNNING);
    job_.set_workers(2);
    job_.set_steps(10);
    job_.set_checkpoint_root(root_);
    job_.add_attempts();  // the first attempt: rank files without an attempt suffix
  }
  void TearDown() override { fs::remove_all(dir_); }

  v1::CheckpointReport Report(int rank, int64_t step) {
    fs::create_directories(root_ + "/" + StepDirName(step));
    v1::CheckpointReport r;
    r.set_job_id("job-1");
    r.set_rank(rank);
    r.set_step(step);
    r.set_path(RankFilePath(root_, step, rank, job_.attempts_size()));
    r.set_size_bytes(10);
    r.set_checksum(std::string(64, 'a'));
    std::ofstream(r.path()) << "shard";
    return r;
  }
  // Both ranks report `step`, and it is committed.
  absl::Status CommitStep(int64_t step) {
    committer_.Add(Report(0, step));
    committer_.Add(Report(1, step));
    absl::Status s = committer_.Commit(job_, config_, step, recorder_);
    committer_.EndStep("job-1", step);
    return s;
  }
  std::vector<int64_t> Steps() const {
    std::vector<int64_t> out;
    for (const auto& c : job_.checkpoints()) out.push_back(c.step());
    return out;
  }
  bool Exists(int64_t step) const { return fs::exists(root_ + "/" + StepDirName(step)); }
  bool HasManifest(int64_t step) const { return fs::exists(root_ + "/" + StepDirName(step) + "/manifest.json"); }

  std::string dir_, root_;
  JobConfig config_;
  v1::Job job_;
  CheckpointCommitter committer_;
  int saves_ = 0;
  CheckpointCommitter::Recorder recorder_{[this] {
                                            ++saves_;
                                            return absl::OkStatus();
                                          },
                                          [this] { ++saves_; }};
};

TEST_F(CommitterTest, AReportMustNameTheRanksOwnFileOfAStepInRange) {
  EXPECT_TRUE(CheckpointCommitter::CheckReport(job_, Report(1, 3)).ok());
  v1::CheckpointReport other = Report(1, 3);
  other.set_path(RankFilePath(root_, 3, 0, 1));  // rank 0's file
  EXPECT_EQ(CheckpointCommitter::CheckReport(job_, other).code(), absl::StatusCode::kPermissionDenied);
  other.set_path(dir_ + "/elsewhere/rank-00001.safetensors");
  EXPECT_EQ(CheckpointCommitter::CheckReport(job_, other).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckpointCommitter::CheckReport(job_, Report(2, 3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckpointCommitter::CheckReport(job_, Report(0, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckpointCommitter::CheckReport(job_, Report(0, 11)).code(), absl::StatusCode::kInvalidArgument);
  v1::CheckpointReport bad_sum = Report(0, 3);
  bad_sum.set_checksum(std::string(64, 'A'));
  EXPECT_EQ(CheckpointCommitter::CheckReport(job_, bad_sum).code(), absl::StatusCode::kInvalidArgument);
  job_.set_state(v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(CheckpointCommitter::CheckReport(job_, Report(0, 3)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CommitterTest, ARanksRepeatedReportCountsOnce) {
  EXPECT_EQ(committer_.Add(Report(0, 2)), 1);
  EXPECT_EQ(committer_.Add(Report(0, 2)), 1);
  EXPECT_EQ(committer_.Add(Report(1, 2)), 2);
  EXPECT_EQ(committer_.Add(Report(0, 3)), 1);
  EXPECT_EQ(committer_.pending_steps("job-1"), 2u);
  committer_.EndStep("job-1", 2);
  EXPECT_EQ(committer_.pending_steps("job-1"), 1u);
}

TEST_F(CommitterTest, TheRecordNamesAStepBeforeItsManifestAppears) {
  bool manifest_at_save = true;
  std::vector<int64_t> steps_at_save;
  recorder_.save_or_error = [&] {
    manifest_at_save = HasManifest(4);
    steps_at_save = Steps();
    return absl::OkStatus();
  };
  ASSERT_TRUE(CommitStep(4).ok());
  EXPECT_FALSE(manifest_at_save);
  EXPECT_EQ(steps_at_save, std::vector<int64_t>{4});
  EXPECT_TRUE(HasManifest(4));
  auto m = ReadManifest(root_ + "/" + StepDirName(4));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 4);
  EXPECT_EQ(m->ranks.size(), 2u);
}

TEST_F(CommitterTest, ARecordThatCannotBeSavedCommitsNothing) {
  ASSERT_TRUE(CommitStep(2).ok());
  recorder_.save_or_error = [] { return absl::ResourceExhaustedError("disk full"); };
  absl::Status s = CommitStep(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "the coordinator could not save its state: disk full");
  EXPECT_EQ(Steps(), std::vector<int64_t>{2});
  EXPECT_FALSE(HasManifest(4));
}

TEST_F(CommitterTest, KeepLatestKeepsTheNewestStepsAndRemovesInterruptedSavesBelowTheNewest) {
  ASSERT_TRUE(CommitStep(1).ok());
  ASSERT_TRUE(CommitStep(2).ok());
  // A save that was interrupted (no manifest), and one still being reported.
  Report(0, 3);
  committer_.Add(Report(0, 6));
  ASSERT_TRUE(CommitStep(5).ok());
  EXPECT_EQ(Steps(), (std::vector<int64_t>{2, 5}));
  EXPECT_FALSE(Exists(1));
  EXPECT_TRUE(HasManifest(2));
  EXPECT_TRUE(HasManifest(5));
  EXPECT_FALSE(Exists(3));  // interrupted, older than the newest commit
  EXPECT_TRUE(Exists(6));   // newer, and being reported
  committer_.RemoveInterruptedSaves(job_, INT64_MAX);
  EXPECT_TRUE(Exists(6));  // still being reported
  committer_.DropReports("job-1");
  committer_.RemoveInterruptedSaves(job_, INT64_MAX);
  EXPECT_FALSE(Exists(6));
  EXPECT_TRUE(HasManifest(5));  // a committed one is never an interrupted save
}

// A step directory a queued job will resume from outlives keep_latest until
// nobody needs it: pruned at the first commit after that.
TEST_F(CommitterTest, PruneSparesAStepAQueuedJobWillResumeFrom) {
  const std::string needed = root_ + "/" + StepDirName(1);
  bool queued = true;
  committer_.set_in_use([&](const std::string& dir) { return queued && dir == needed; });
  for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(CommitStep(step).ok());
  EXPECT_EQ(Steps(), (std::vector<int64_t>{1, 3}));  // 2 dropped in its place
  EXPECT_TRUE(HasManifest(1));
  EXPECT_FALSE(Exists(2));
  queued = false;  // the job started (or went)
  ASSERT_TRUE(CommitStep(4).ok());
  EXPECT_EQ(Steps(), (std::vector<int64_t>{3, 4}));
  EXPECT_FALSE(Exists(1));
}

TEST_F(CommitterTest, PruneNeverDropsTheNewestAndKeepsAllAtZero) {
  for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(CommitStep(step).ok());
  committer_.Prune(job_, 0, recorder_);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{2, 3}));  // unchanged: keep_latest 2 already applied
  committer_.Prune(job_, 1, recorder_);
  EXPECT_EQ(Steps(), std::vector<int64_t>{3});
  EXPECT_FALSE(Exists(2));
  EXPECT_TRUE(HasManifest(3));
}

TEST_F(CommitterTest, AManifestThatCannotBeWrittenLeavesTheRecordAsItWas) {
  ASSERT_TRUE(CommitStep(2).ok());
  committer_.Add(Report(0, 4));
  committer_.Add(Report(1, 4));
  fs::remove_all(root_ + "/" + StepDirName(4));
  fs::create_symlink(dir_, root_ + "/" + StepDirName(4));  // not the job's own directory
  const int saves = saves_;
  absl::Status s = committer_.Commit(job_, config_, 4, recorder_);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Steps(), std::vector<int64_t>{2});
  EXPECT_EQ(saves_, saves + 2);  // named, then unnamed again
  EXPECT_FALSE(fs::exists(dir_ + "/manifest.json"));
}

}  // namespace
}  // namespace shardline
