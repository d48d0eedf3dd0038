// Issue 12, confined checkpoint files: the coordinator (which may run as
// root) writes a manifest only into the job's own step directory and removes
// nothing but what the project writes there, never through a symlink that a
// user planted in their checkpoint root; readers do not follow a rank file or
// manifest that is a symlink.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/checkpoint/checkpoint_export.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/model/safetensors.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"
#include "tests/unit/core_fixture.h"

namespace shardline {
namespace {

namespace fs = std::filesystem;

using testing_core::RecordingChannel;

// One rank, no restarts (a refused commit fails the job for good), and
// keep_latest = 1 so that the second commit prunes the first.
const std::string kSpec = testing_core::TinySpec("max_restarts = 0", 5, "[checkpoint]\nkeep_latest = 1\n");

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A directory of someone else's files, with their contents.
struct Victim {
  std::string dir;
  std::map<std::string, std::string> files;
  void Create(const std::string& path, bool with_manifest) {
    dir = path;
    fs::create_directories(dir);
    files = {{"passwd", "root:x:0:0\n"}, {"rank-00000.safetensors", "not yours\n"}, {"notes.txt", "keep me\n"}};
    if (with_manifest) files["manifest.json"] = "{\"theirs\": true}\n";
    for (const auto& [name, text] : files) std::ofstream(dir + "/" + name) << text;
  }
  // Every file still there with its own content, and nothing added.
  void ExpectIntact() const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      ++n;
      EXPECT_TRUE(files.count(e.path().filename().string())) << "added: " << e.path();
    }
    EXPECT_EQ(n, files.size()) << dir;
    for (const auto& [name, text] : files) EXPECT_EQ(Slurp(dir + "/" + name), text) << dir << "/" << name;
  }
};

class ConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/confine-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    store_ = *StateStore::Open(dir_ + "/state");
    core_ = std::make_unique<CoordinatorCore>(store_.get(),
                                             CoordinatorOptions{absl::Milliseconds(100), 3, absl::Milliseconds(50), absl::Milliseconds(50)});
    v1::WorkerInfo info;
    info.set_host("h");
    info.set_device("cpu");
    worker_ = core_->RegisterWorker(info, &channel_)->worker_id();
    v1::SubmitJobRequest r;
    r.set_spec_toml(kSpec);
    r.set_workers(1);
    r.set_base_dir(dir_);  // its checkpoints go under the test's directory
    absl::StatusOr<std::string> id = core_->Submit(r);
    ASSERT_TRUE(id.ok()) << id.status();
    job_ = *id;
    ASSERT_EQ(JobStateName(core_->GetJob(job_)->state()), "RUNNING");
    root_ = core_->GetJob(job_)->checkpoint_root();
  }
  // Rank 0 reports its file of `step`, with its own credential.
  absl::Status Report(int64_t step) {
    v1::CheckpointReport r;
    r.set_job_id(job_);
    r.set_rank(0);
    r.set_step(step);
    r.set_path(RankFilePath(root_, step, 0));
    r.set_size_bytes(10);
    r.set_checksum(std::string(64, 'a'));
    return core_->ReportCheckpoint(r, channel_.Starts().back().credential());
  }
  // Ends the job (its rank reports back) and deletes it with its checkpoints.
  void CancelAndDelete() {
    (void)core_->Cancel(job_);  // FailedPrecondition where it already FAILED
    v1::RankFinished f;
    f.set_job_id(job_);
    f.set_rank(0);
    f.set_ok(false);
    f.set_message("stopped");
    f.set_code(static_cast<int>(absl::StatusCode::kCancelled));
    core_->OnFinished(worker_, f);
    absl::StatusOr<int> deleted = core_->Delete(job_, /*checkpoints=*/true);
    ASSERT_TRUE(deleted.ok()) << deleted.status();
  }
  std::string StepDir(int64_t step) const { return root_ + "/" + StepDirName(step); }
  // The victims live under dir_ too; remove_all unlinks symlinks, never their targets.
  void TearDown() override {
    core_.reset();
    store_.reset();
    fs::remove_all(dir_);
  }

  std::string dir_, worker_, job_, root_;
  RecordingChannel channel_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<CoordinatorCore> core_;
};

TEST_F(ConfinementTest, AStepDirectoryThatIsASymlinkIsNeitherWrittenNorEmptied) {
  Victim victim;
  victim.Create(dir_ + "/etc", /*with_manifest=*/true);
  fs::create_directories(root_);
  fs::create_directory_symlink(victim.dir, StepDir(3));
  absl::Status s = Report(3);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(StepDir(3) + ": is a symlink"), std::string::npos) << s;
  const v1::Job j = *core_->GetJob(job_);
  EXPECT_EQ(JobStateName(j.state()), "FAILED");
  EXPECT_NE(j.message().find("checkpoint of step 3 not committed: " + StepDir(3)), std::string::npos) << j.message();
  EXPECT_EQ(j.checkpoints_size(), 0);
  victim.ExpectIntact();
  CancelAndDelete();
  victim.ExpectIntact();
  EXPECT_TRUE(fs::is_symlink(StepDir(3)));  // not the coordinator's to remove
}

TEST_F(ConfinementTest, ACheckpointRootThatIsASymlinkIsNeitherWrittenNorEmptied) {
  // The job's root leads into another directory holding a step directory
  // of the same name (another job's, say).
  Victim victim;
  victim.Create(dir_ + "/other-job/" + StepDirName(3), /*with_manifest=*/true);
  fs::create_directories(fs::path(root_).parent_path());
  fs::create_directory_symlink(dir_ + "/other-job", root_);
  absl::Status s = Report(3);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(root_ + ": is a symlink"), std::string::npos) << s;
  EXPECT_EQ(JobStateName(core_->GetJob(job_)->state()), "FAILED");
  CancelAndDelete();
  victim.ExpectIntact();
}

TEST_F(ConfinementTest, ASymlinkPlantedAsAnInterruptedSaveIsNotFollowed) {
  Victim victim;
  victim.Create(dir_ + "/etc", /*with_manifest=*/false);  // no manifest: it looks interrupted
  fs::create_directories(StepDir(2));
  fs::create_directory_symlink(victim.dir, StepDir(1));
  // Committing step 2 removes the interrupted saves below it.
  ASSERT_TRUE(Report(2).ok());
  EXPECT_TRUE(fs::exists(StepDir(2) + "/manifest.json"));
  EXPECT_EQ(core_->GetJob(job_)->checkpoints_size(), 1);
  victim.ExpectIntact();
  EXPECT_TRUE(fs::is_symlink(StepDir(1)));
  CancelAndDelete();
  victim.ExpectIntact();
}

TEST_F(ConfinementTest, PruningRemovesOnlyTheFilesTheProjectWrites) {
  Victim outside;
  outside.Create(dir_ + "/outside", /*with_manifest=*/false);
  fs::create_directories(StepDir(1));
  for (const char* own : {"rank-00000.safetensors", "rank-00000.safetensors.tmp", "manifest.json.tmp"}) {
    std::ofstream(StepDir(1) + "/" + own) << "ours";
  }
  std::ofstream(StepDir(1) + "/notes.txt") << "the user's";
  // A link under a name the project writes goes, what it names stays.
  fs::create_symlink(outside.dir + "/passwd", StepDir(1) + "/rank-00001.safetensors");
  ASSERT_TRUE(Report(1).ok());
  ASSERT_TRUE(fs::exists(StepDir(1) + "/manifest.json"));
  fs::create_directories(StepDir(2));
  ASSERT_TRUE(Report(2).ok());  // keep_latest = 1: step 1 is pruned
  absl::StatusOr<std::vector<v1::CheckpointInfo>> listed = core_->ListCheckpoints(job_);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].step(), 2);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(StepDir(1))) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"});
  EXPECT_EQ(Slurp(StepDir(1) + "/notes.txt"), "the user's");
  outside.ExpectIntact();
  EXPECT_TRUE(fs::exists(StepDir(2) + "/manifest.json"));
}

TEST_F(ConfinementTest, AManifestThatCannotBePutInPlaceIsNotRecorded) {
  // Something the rename cannot replace stands where the manifest goes.
  fs::create_directories(StepDir(2) + "/manifest.json/inside");
  absl::Status s = Report(2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(StepDir(2) + "/manifest.json: rename failed"), std::string::npos) << s;
  EXPECT_EQ(JobStateName(core_->GetJob(job_)->state()), "FAILED");
  EXPECT_EQ(core_->GetJob(job_)->checkpoints_size(), 0);
  EXPECT_FALSE(fs::exists(StepDir(2) + "/manifest.json.tmp"));
  // Nor in the persisted record (Recover would keep it: its manifest.json exists).
  core_.reset();
  CoordinatorCore restarted(store_.get(), CoordinatorOptions{});
  ASSERT_TRUE(restarted.Recover().ok());
  EXPECT_TRUE(restarted.ListCheckpoints(job_)->empty());
}

// A one-rank checkpoint of a small model, written as the ranks write it.
class ReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/confine-reader-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    step_dir_ = dir_ + "/job-1/" + StepDirName(1);
    fs::create_directories(step_dir_);
    JobConfig c;
    c.model.n_layer = 1;
    c.model.n_head = 2;
    c.model.n_embd = 8;
    c.model.vocab_size = 16;
    c.model.block_size = 4;
    c.train.steps = 5;
    absl::StatusOr<CheckpointManifest> made = NewManifest("job-1", c, 1, 1);
    ASSERT_TRUE(made.ok()) << made.status();
    manifest_ = *made;
    const std::string path = step_dir_ + "/" + RankFileName(0);
    std::vector<SafetensorsStreamWriter::Decl> decls;
    for (const ManifestUnit& u : manifest_.units) {
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) decls.push_back({u.unit + "." + kind, {u.shard}});
    }
    absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> w = SafetensorsStreamWriter::Create(path, decls);
    ASSERT_TRUE(w.ok()) << w.status();
    for (const auto& d : decls) {
      std::vector<float> v(d.shape[0], 0.5f);
      ASSERT_TRUE((*w)->Append(v.data(), d.shape[0]).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
    absl::StatusOr<std::string> sha = Sha256OfFileNoFollow(path);
    ASSERT_TRUE(sha.ok()) << sha.status();
    manifest_.ranks = {{0, RankFileName(0), static_cast<int64_t>(fs::file_size(path)), *sha}};
    ASSERT_TRUE(WriteManifest(step_dir_, manifest_).ok());
  }
  // Reads the first element of unit 0's parameters through a new reader.
  absl::Status ReadOne() {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(step_dir_);
    if (!r.ok()) return r.status();
    float x = 0;
    absl::Status s = (*r)->Read(0, "param", 0, 1, &x);
    if (s.ok()) EXPECT_EQ(x, 0.5f);
    return s;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_, step_dir_;
  CheckpointManifest manifest_;
};

TEST_F(ReaderTest, ARankFileThatIsASymlinkIsRefused) {
  ASSERT_TRUE(ReadOne().ok());
  // The same bytes (checksum matching) moved out of the directory, a link left in their place.
  const std::string inside = step_dir_ + "/" + RankFileName(0), outside = dir_ + "/elsewhere.safetensors";
  fs::rename(inside, outside);
  fs::create_symlink(outside, inside);
  absl::Status s = ReadOne();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(inside + ": is a symlink"), std::string::npos) << s;
}

TEST_F(ReaderTest, AManifestThatIsASymlinkIsRefused) {
  const std::string inside = step_dir_ + "/manifest.json", outside = dir_ + "/elsewhere.json";
  fs::rename(inside, outside);
  fs::create_symlink(outside, inside);
  absl::StatusOr<CheckpointManifest> m = ReadManifest(step_dir_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kPermissionDenied) << m.status();
  EXPECT_NE(m.status().message().find(inside + ": is a symlink"), std::string::npos) << m.status();
  fs::remove(inside);
  m = ReadManifest(step_dir_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
  EXPECT_NE(m.status().message().find("no manifest.json: not a committed checkpoint"), std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace shardline
