// TokenDataset: docs/design.md's batch order and every bad file named in its error.
#include "worker/data/token_dataset.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

namespace shardline {
namespace {

class TokenDatasetTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) { return ::testing::TempDir() + "/" + name; }
  struct Source {
    DataFormat format;
    TokenSource files;
  };
  static Source Llmc(const std::string& path) { return {DataFormat::kLlmc, {{path}, {}}}; }
  static Source Text(const std::string& path) { return {DataFormat::kText, {{path}, {}}}; }
  static Source Synthetic() { return {DataFormat::kSynthetic, {}}; }
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(const Source& s, int vocab, int block, uint64_t seed) {
    return TokenDataset::Open(s.format, s.files, vocab, block, seed);
  }
  std::string ErrorOf(const Source& d, int vocab = 64, int block = 4) {
    auto ds = Open(d, vocab, block, 1);
    return ds.ok() ? "" : std::string(ds.status().message());
  }
};

TEST_F(TokenDatasetTest, OrderFollowsTheGlobalStep) {
  std::vector<uint16_t> tokens(41);
  for (int i = 0; i < 41; ++i) tokens[i] = static_cast<uint16_t>(i);
  const std::string p = Path("order.bin");
  ASSERT_TRUE(WriteLlmcFile(p, tokens).ok());
  auto ds = Open(Llmc(p), 64, 4, 1);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_sequences(), 10);  // floor(40 / 4)
  // Step 3 with B = 4 uses sequences (12 + j) mod 10 = 2, 3, 4, 5.
  at::Tensor x, y;
  (*ds)->Batch(3, 4, 1, 2, &x, &y);  // j = 1, 2 -> sequences 3, 4
  EXPECT_EQ(x[0][0].item<int64_t>(), 12);
  EXPECT_EQ(x[1][3].item<int64_t>(), 19);
  EXPECT_EQ(y[1][3].item<int64_t>(), 20);
  // Any split of j over ranks reads the same stream.
  at::Tensor all_x, all_y;
  (*ds)->Batch(3, 4, 0, 4, &all_x, &all_y);
  EXPECT_TRUE(all_x.narrow(0, 1, 2).equal(x));
}

TEST_F(TokenDatasetTest, Llama3FilesHoldUint32Tokens) {
  // Llama 3's vocabulary (128,256) does not fit uint16: llm.c's magic 20240801, version 7.
  std::vector<uint32_t> tokens(41);
  for (int i = 0; i < 41; ++i) tokens[i] = 100000u + static_cast<uint32_t>(i);
  const std::string p = Path("llama3.bin");
  ASSERT_TRUE(WriteLlmcFile(p, tokens).ok());
  auto ds = Open(Llmc(p), 128256, 4, 1);
  ASSERT_TRUE(ds.ok()) << ds.status();
  at::Tensor x, y;
  (*ds)->Batch(0, 2, 1, 1, &x, &y);  // sequence 1: tokens 4..7, targets 5..8
  EXPECT_EQ(x[0][0].item<int64_t>(), 100004);
  EXPECT_EQ(y[0][3].item<int64_t>(), 100008);
  // A token past the vocabulary is named with its position.
  const std::string e = ErrorOf(Llmc(p), 100010);
  EXPECT_NE(e.find(p + ": token 100010 at position 10 is >= vocab_size 100010"), std::string::npos) << e;
  // The version belongs to the magic.
  { std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary); f.seekp(4); int32_t v = 1; f.write(reinterpret_cast<char*>(&v), 4); }
  const std::string v = ErrorOf(Llmc(p), 128256);
  EXPECT_NE(v.find("unsupported llm.c version 1 (expected 7 for magic 20240801)"), std::string::npos) << v;
}

TEST_F(TokenDatasetTest, BadMagicNamesTheFile) {
  const std::string p = Path("magic.bin");
  ASSERT_TRUE(WriteLlmcFile(p, std::vector<uint16_t>(100, 1)).ok());
  { std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary); int32_t bad = 7; f.write(reinterpret_cast<char*>(&bad), 4); }
  const std::string e = ErrorOf(Llmc(p));
  EXPECT_NE(e.find(p), std::string::npos) << e;
  EXPECT_NE(e.find("bad magic 7"), std::string::npos) << e;
}

TEST_F(TokenDatasetTest, TruncatedFileNamesTheFile) {
  const std::string p = Path("trunc.bin");
  ASSERT_TRUE(WriteLlmcFile(p, std::vector<uint16_t>(100, 1)).ok());
  ASSERT_EQ(truncate(p.c_str(), 1024 + 150), 0);
  const std::string e = ErrorOf(Llmc(p));
  EXPECT_NE(e.find(p + ": truncated"), std::string::npos) << e;
  const std::string h = Path("header.bin");
  std::ofstream(h) << "short";
  EXPECT_NE(ErrorOf(Llmc(h)).find(h + ": truncated llm.c header"), std::string::npos);
}

TEST_F(TokenDatasetTest, TokenOutsideVocabNamesFileAndPosition) {
  std::vector<uint16_t> tokens(100, 1);
  tokens[57] = 64;
  const std::string p = Path("vocab.bin");
  ASSERT_TRUE(WriteLlmcFile(p, tokens).ok());
  const std::string e = ErrorOf(Llmc(p), 64);
  EXPECT_NE(e.find(p + ": token 64 at position 57 is >= vocab_size 64"), std::string::npos) << e;
}

TEST_F(TokenDatasetTest, FileShorterThanOneSequenceNamesTheFile) {
  const std::string p = Path("short.bin");
  ASSERT_TRUE(WriteLlmcFile(p, std::vector<uint16_t>(4, 1)).ok());
  const std::string e = ErrorOf(Llmc(p), 64, 4);
  EXPECT_NE(e.find(p + ": 4 tokens is shorter than one sequence"), std::string::npos) << e;
  const std::string t = Path("short.txt");
  std::ofstream(t) << "abc";
  EXPECT_NE(ErrorOf(Text(t), 256, 8).find(t + ": 3 tokens"), std::string::npos);
}

TEST_F(TokenDatasetTest, MissingFileIsNamed) {
  const std::string e = ErrorOf(Llmc(Path("nope.bin")));
  EXPECT_NE(e.find("[data] path: " + Path("nope.bin") + ": no such file"), std::string::npos) << e;
}

TEST_F(TokenDatasetTest, TextIsBytes) {
  const std::string p = Path("t.txt");
  std::ofstream(p) << "hello world, hello shards";
  auto ds = Open(Text(p), 256, 4, 1);
  ASSERT_TRUE(ds.ok());
  at::Tensor x, y;
  (*ds)->Batch(0, 1, 0, 1, &x, &y);
  EXPECT_EQ(x[0][0].item<int64_t>(), 'h');
  EXPECT_EQ(y[0][0].item<int64_t>(), 'e');
}

TEST_F(TokenDatasetTest, SyntheticIsAFunctionOfTheSeed) {
  auto a = Open(Synthetic(), 64, 8, 5);
  auto b = Open(Synthetic(), 64, 8, 5);
  auto c = Open(Synthetic(), 64, 8, 6);
  at::Tensor xa, ya, xb, yb, xc, yc;
  (*a)->Batch(7, 4, 0, 4, &xa, &ya);
  (*b)->Batch(7, 4, 0, 4, &xb, &yb);
  (*c)->Batch(7, 4, 0, 4, &xc, &yc);
  EXPECT_TRUE(xa.equal(xb));
  EXPECT_FALSE(xa.equal(xc));
  EXPECT_LT(xa.max().item<int64_t>(), 64);
}

TEST_F(TokenDatasetTest, FilesAndGlobsAreOneStreamInOrder) {
  // Three shards of 10 tokens each (0..29), named so that a glob sorts them.
  for (int f = 0; f < 3; ++f) {
    std::vector<uint16_t> tokens(10);
    for (int i = 0; i < 10; ++i) tokens[i] = static_cast<uint16_t>(f * 10 + i);
    ASSERT_TRUE(WriteLlmcFile(Path("shard_" + std::to_string(f) + ".bin"), tokens).ok());
  }
  Source s{DataFormat::kLlmc, {{Path("shard_[12].bin"), Path("shard_0.bin")}, {}}};  // listed order, then globs sorted
  auto ds = Open(s, 64, 4, 1);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 30);
  at::Tensor x, y;
  (*ds)->Batch(0, 7, 0, 7, &x, &y);
  // The stream is 10..29 then 0..9: sequence 2 (positions 8..11) crosses from shard 1 into shard 2.
  EXPECT_EQ(x[2][0].item<int64_t>(), 18);
  EXPECT_EQ(x[2][2].item<int64_t>(), 20);
  EXPECT_EQ(y[4][3].item<int64_t>(), 0);  // position 20 is shard 0's first token
  const std::string dir = ErrorOf({DataFormat::kLlmc, {{::testing::TempDir()}, {}}});
  EXPECT_NE(dir.find("not a regular file (a directory or device)"), std::string::npos) << dir;
  const std::string e = ErrorOf({DataFormat::kLlmc, {{Path("shard_9*.bin")}, {}}});
  EXPECT_NE(e.find("[data] path: " + Path("shard_9*.bin") + ": no such file"), std::string::npos) << e;
}

TEST_F(TokenDatasetTest, ADeviceOrAFifoIsNotAFile) {
  // /dev/zero would map as endless zero tokens (or fail in mmap), a FIFO
  // would block the open: each path is refused naming it, in every role.
  for (const Source& s : {Llmc("/dev/zero"), Text("/dev/zero")}) {
    const std::string e = ErrorOf(s, 256);
    EXPECT_NE(e.find("[data] path: /dev/zero: not a regular file (a directory or device)"), std::string::npos) << e;
  }
  const std::string tokens = Path("masked_dev.bin");
  ASSERT_TRUE(WriteLlmcFile(tokens, std::vector<uint16_t>(16, 1)).ok());
  const std::string mask = ErrorOf({DataFormat::kLlmc, {{tokens}, {"/dev/zero"}}});
  EXPECT_NE(mask.find("[data] mask_path: /dev/zero: not a regular file"), std::string::npos) << mask;
  const std::string fifo = Path("tokens.fifo");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string f = ErrorOf(Llmc(fifo));
  EXPECT_NE(f.find(fifo + ": not a regular file"), std::string::npos) << f;
  std::remove(fifo.c_str());
}

TEST_F(TokenDatasetTest, MaskedTargetsAreIgnoredAndNotCounted) {
  std::vector<uint16_t> tokens(21);
  std::vector<uint8_t> mask(21);
  for (int i = 0; i < 21; ++i) {
    tokens[i] = static_cast<uint16_t>(i);
    mask[i] = i % 3 == 0;  // tokens 0, 3, 6, ... count as targets
  }
  ASSERT_TRUE(WriteLlmcFile(Path("sft.bin"), tokens).ok());
  ASSERT_TRUE(WriteLossMaskFile(Path("sft.mask"), mask).ok());
  Source s{DataFormat::kLlmc, {{Path("sft.bin")}, {Path("sft.mask")}}};
  auto ds = Open(s, 64, 4, 1);
  ASSERT_TRUE(ds.ok()) << ds.status();
  at::Tensor x, y;
  (*ds)->Batch(0, 2, 0, 2, &x, &y);  // targets 1..4 and 5..8
  EXPECT_EQ(y[0][0].item<int64_t>(), kIgnoreTarget);
  EXPECT_EQ(y[0][2].item<int64_t>(), 3);
  EXPECT_EQ(y[1][1].item<int64_t>(), 6);
  EXPECT_EQ(y[1][2].item<int64_t>(), kIgnoreTarget);
  EXPECT_EQ(x[0][0].item<int64_t>(), 0);  // inputs are never masked
  EXPECT_EQ((*ds)->CountedTargets(0, 2), 2);  // 3 and 6
  EXPECT_EQ(y.ne(kIgnoreTarget).sum().item<int64_t>(), 2);
  // A mask of another length, a byte other than 0/1, and a count mismatch are named.
  ASSERT_TRUE(WriteLossMaskFile(Path("short.mask"), std::vector<uint8_t>(20, 1)).ok());
  std::string e = ErrorOf({DataFormat::kLlmc, {{Path("sft.bin")}, {Path("short.mask")}}});
  EXPECT_NE(e.find(Path("short.mask") + ": mask of 20 entries for " + Path("sft.bin") + " of 21 tokens"),
            std::string::npos) << e;
  mask[5] = 2;
  ASSERT_TRUE(WriteLossMaskFile(Path("two.mask"), mask).ok());
  e = ErrorOf({DataFormat::kLlmc, {{Path("sft.bin")}, {Path("two.mask")}}});
  EXPECT_NE(e.find(Path("two.mask") + ": mask byte 2 at position 5"), std::string::npos) << e;
  e = ErrorOf({DataFormat::kLlmc, {{Path("sft.bin")}, {Path("sft.mask"), Path("sft.mask")}}});
  EXPECT_NE(e.find("[data] mask_path names 2 files for 1 token files"), std::string::npos) << e;
  e = ErrorOf({DataFormat::kLlmc, {{Path("sft.bin")}, {Path("sft.bin")}}});
  EXPECT_NE(e.find("not a loss mask file"), std::string::npos) << e;
}

}  // namespace
}  // namespace shardline
