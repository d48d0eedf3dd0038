// ReadManifest refuses what would make a reader divide by zero, allocate
// without bound, read another step's files or mix up elements: each a
// DataLoss naming the manifest and the field (issue 12's findings).
#include "common/checkpoint_manifest.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/model_shapes.h"

namespace shardline {
namespace {

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/manifest-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
    JobConfig c;
    c.model.n_layer = 2;
    c.model.n_head = 4;
    c.model.n_embd = 32;
    c.model.vocab_size = 64;
    c.model.block_size = 16;
    absl::StatusOr<CheckpointManifest> made = NewManifest("job-1", c, 2, 4);
    ASSERT_TRUE(made.ok());
    CheckpointManifest& m = *made;
    m.ranks = {{0, "rank-00000.safetensors", 10, "ab"}, {1, "rank-00001.safetensors", 10, "cd"}};
    ASSERT_TRUE(WriteManifest(dir_, m).ok());
    std::ifstream in(dir_ + "/manifest.json");
    std::stringstream ss;
    ss << in.rdbuf();
    good_ = ss.str();
  }
  // The error of the good manifest with `from` replaced by `to` (once).
  std::string ErrorWith(const std::string& from, const std::string& to) {
    std::string text = good_;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    std::ofstream(dir_ + "/manifest.json", std::ios::trunc) << text;
    auto m = ReadManifest(dir_);
    return m.ok() ? "" : std::string(m.status().message());
  }
  std::string dir_, good_;
};

TEST_F(ManifestTest, AGoodManifestReadsBack) {
  auto m = ReadManifest(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->units.size(), 4u);
}

TEST_F(ManifestTest, AShardOfZeroIsRefused) {
  const std::string e = ErrorWith("\"shard\": 1280", "\"shard\": 0");
  EXPECT_NE(e.find("manifest.json: malformed manifest: shard = 0 is out of range"), std::string::npos) << e;
}

TEST_F(ManifestTest, NumelsThatAreNotTheModelsAreRefused) {
  std::string e = ErrorWith("\"numel\": 2560", "\"numel\": -5");
  EXPECT_NE(e.find("numel = -5 is out of range"), std::string::npos) << e;
  e = ErrorWith("\"numel\": 2560", "\"numel\": 4611686018427387904");
  EXPECT_NE(e.find("numel = 4611686018427387904 is out of range"), std::string::npos) << e;
  e = ErrorWith("\"numel\": 2560", "\"numel\": 2559");
  EXPECT_NE(e.find("ownership of unit 0 (embed: numel 2559"), std::string::npos) << e;
}

TEST_F(ManifestTest, AVocabularyBeyondItsBoundIsRefused) {
  const std::string e = ErrorWith("\"vocab_size\": 64", "\"vocab_size\": 2147483647");
  EXPECT_NE(e.find("vocab_size = 2147483647 is out of range"), std::string::npos) << e;
}

TEST_F(ManifestTest, AFileNameThatLeavesTheDirectoryIsRefused) {
  const std::string e = ErrorWith("\"rank-00001.safetensors\"",
                                  "\"../../../ckpt/job-18/step-00000004/rank-00001.safetensors\"");
  EXPECT_NE(e.find("rank 1's file \"../../../ckpt/job-18/step-00000004/rank-00001.safetensors\" is not a file name"),
            std::string::npos)
      << e;
}

TEST_F(ManifestTest, AMissingOrRepeatedRankIsRefused) {
  EXPECT_NE(ErrorWith("\"rank\": 1", "\"rank\": 0").find("rank 0 is out of range or listed twice"),
            std::string::npos);
  EXPECT_NE(ErrorWith("\"rank\": 1", "\"rank\": 7").find("rank 7 is out of range"), std::string::npos);
}

}  // namespace
}  // namespace shardline
