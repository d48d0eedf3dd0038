// A rank's checkpoint write (WriteRankShards) where a user planted symlinks
// (issue 24): a step directory, or the job's checkpoint root, that is a link
// to another job's is refused naming it, and the other job's committed file
// keeps its bytes; a link under the temp file's name is not written through.
#include "worker/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace shardline {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ShardSnapshot TinySnapshot() {
  ShardSnapshot s;
  s.rank = 0;
  s.units = {"wte"};
  s.shards = {{at::ones({4}), at::zeros({4}), at::zeros({4})}};
  return s;
}

class RankWrite : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test: ctest -j runs this binary's tests side by side.
    base_ = ::testing::TempDir() + "/rank-write-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(base_);
    victim_step_ = base_ + "/a/job-1/step-00000010";
    fs::create_directories(victim_step_);
    victim_ = victim_step_ + "/rank-00000.safetensors";
    std::ofstream(victim_) << "A's committed shard";
  }
  void TearDown() override { fs::remove_all(base_); }
  std::string base_, victim_step_, victim_;
};

TEST_F(RankWrite, AStepDirectoryThatIsASymlinkIsRefused) {
  fs::create_directories(base_ + "/b/job-2");
  fs::create_directory_symlink(victim_step_, base_ + "/b/job-2/step-00000010");
  auto w = WriteRankShards(TinySnapshot(), base_ + "/b/job-2/step-00000010", 10);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kPermissionDenied) << w.status();
  EXPECT_NE(w.status().message().find("step-00000010: is a symlink"), std::string::npos) << w.status();
  EXPECT_EQ(Slurp(victim_), "A's committed shard");
}

TEST_F(RankWrite, ARootThatIsASymlinkIsRefused) {
  fs::create_directories(base_ + "/b");
  fs::create_directory_symlink(base_ + "/a/job-1", base_ + "/b/job-2");
  auto w = WriteRankShards(TinySnapshot(), base_ + "/b/job-2/step-00000010", 10);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kPermissionDenied) << w.status();
  EXPECT_EQ(Slurp(victim_), "A's committed shard");
}

TEST_F(RankWrite, ATempFileThatIsASymlinkIsReplacedNotFollowed) {
  const std::string step = base_ + "/b/job-2/step-00000010";
  fs::create_directories(step);
  fs::create_symlink(victim_, step + "/rank-00000.safetensors.tmp");
  auto w = WriteRankShards(TinySnapshot(), step, 10);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(fs::is_regular_file(step + "/rank-00000.safetensors"));
  EXPECT_FALSE(fs::exists(step + "/rank-00000.safetensors.tmp"));
  EXPECT_EQ(Slurp(victim_), "A's committed shard");
}

}  // namespace
}  // namespace shardline
