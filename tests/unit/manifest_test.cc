// ReadManifest refuses what would make a reader divide by zero, allocate
// without bound, read another step's files or mix up elements: each a
// DataLoss naming the manifest and the field (issue 12's findings).
#include "common/checkpoint/checkpoint_manifest.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/model/model_shapes.h"
#include "common/model/safetensors.h"
#include "common/model/weight_source.h"

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

// A LoRA checkpoint records a digest of its base's weights: a different
// base of the same shapes later found at the same path is refused for resume
// and merge; the same weights rewritten give the same digest.
TEST_F(ManifestTest, ALoraBaseIsKnownByItsWeightsNotItsPath) {
  JobConfig c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 8;
  c.model.vocab_size = 16;
  c.model.block_size = 4;
  c.model.init_from = dir_ + "/base.safetensors";
  c.lora.enabled = true;
  std::vector<SafetensorsStreamWriter::Decl> decls;
  int64_t numel = 0;
  for (int u = 0; u < model::NumUnits(c.model); ++u) {
    for (const ParamSpec& p : model::UnitParams(c.model, u)) {
      decls.push_back({p.name, p.shape});
      numel += p.numel();
    }
  }
  auto write_base = [&](float delta_at_end) {
    std::vector<float> values(numel);
    for (int64_t i = 0; i < numel; ++i) values[i] = 0.01f * static_cast<float>(i % 97);
    values[numel - 1] += delta_at_end;  // a fine-tune differs everywhere; one weight at the end is enough here
    auto w = SafetensorsStreamWriter::Create(c.model.init_from, decls);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append(values.data(), numel).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  };
  write_base(0);
  absl::StatusOr<std::string> first = BaseWeightsDigest(c.model);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 64u);
  c.lora.base_digest = *first;
  absl::StatusOr<CheckpointManifest> m = NewManifest("job-1", c, 1, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  m->ranks = {{0, "rank-00000.safetensors", 10, "ab"}};
  ASSERT_TRUE(WriteManifest(dir_, *m).ok());
  absl::StatusOr<CheckpointManifest> read = ReadManifest(dir_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->lora.base_digest, *first);
  EXPECT_TRUE(CheckSameTraining(*read, c, dir_).ok());

  write_base(0);  // the same weights, written again: the same base
  EXPECT_EQ(*BaseWeightsDigest(c.model), *first);
  EXPECT_TRUE(CheckSameTraining(*read, c, dir_).ok());

  write_base(0.5f);  // another base of the same shapes at the same path
  absl::Status s = CheckSameTraining(*read, c, dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("is not the one these adapters were trained on (its weights differ: base digest " +
                             first->substr(0, 12) + " recorded"),
            std::string::npos)
      << s;
  EXPECT_EQ(CheckBaseDigest(*read, c.model, dir_).code(), absl::StatusCode::kFailedPrecondition);
  read->lora.base_digest.clear();  // a manifest from before digests: not checked
  EXPECT_TRUE(CheckSameTraining(*read, c, dir_).ok());
  // A digest that is not 64 hex digits is a damaged manifest.
  std::string text;
  {
    std::ifstream in(dir_ + "/manifest.json");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  text.replace(text.find(*first), 64, "zz");
  std::ofstream(dir_ + "/manifest.json", std::ios::trunc) << text;
  EXPECT_NE(ReadManifest(dir_).status().message().find("base_digest"), std::string::npos);
}

}  // namespace
}  // namespace shardline
