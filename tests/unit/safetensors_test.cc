// The safetensors reader refuses headers that would make it read the wrong
// bytes (sizes that disagree with shape x dtype, tensors that overlap or
// leave bytes to no tensor), and converts 16-bit floats exactly; the writer's
// bf16 rounds to nearest even and leaves no gaps.
#include "common/model/safetensors.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shardline {
namespace {

// A file of `header` (JSON) followed by `data`.
std::string WriteRaw(const std::string& name, const std::string& header, const std::string& data) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << data;
  return path;
}

TEST(SafetensorsReader, RefusesASizeThatDisagreesWithShapeAndDtype) {
  const std::string path = WriteRaw("size.safetensors",
                                    R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  auto r = SafetensorsReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor w holds 8 bytes, its shape and dtype need 12"), std::string::npos)
      << r.status();
}

TEST(SafetensorsReader, RefusesOverlappingTensors) {
  const std::string path = WriteRaw(
      "overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'));
  auto r = SafetensorsReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensors a and b overlap"), std::string::npos) << r.status();
}

TEST(SafetensorsReader, RefusesAShapeWhoseSizeOverflows) {
  const std::string path = WriteRaw(
      "huge.safetensors", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", "");
  auto r = SafetensorsReader::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad shape"), std::string::npos) << r.status();
}

TEST(SafetensorsReader, ReadsBf16AndF16Exactly) {
  // bf16 0x3FC0 = 1.5, 0xC100 = -8; f16 0x3C00 = 1, 0x0001 = 2^-24 (subnormal), 0xFC00 = -inf.
  const uint16_t bf16[] = {0x3FC0, 0xC100};
  const uint16_t f16[] = {0x3C00, 0x0001, 0xFC00};
  const std::string path = WriteRaw(
      "half.safetensors",
      R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"h":{"dtype":"F16","shape":[3],"data_offsets":[4,10]}})",
      std::string(reinterpret_cast<const char*>(bf16), 4) + std::string(reinterpret_cast<const char*>(f16), 6));
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  float b[2], h[3];
  ASSERT_TRUE((*r)->ReadFloats("b", 0, 2, b).ok());
  ASSERT_TRUE((*r)->ReadFloats("h", 0, 3, h).ok());
  EXPECT_EQ(b[0], 1.5f);
  EXPECT_EQ(b[1], -8.0f);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[2]) && h[2] < 0);
  // A range inside the tensor, read in place.
  float one;
  ASSERT_TRUE((*r)->ReadFloats("h", 1, 1, &one).ok());
  EXPECT_EQ(one, std::ldexp(1.0f, -24));
}

TEST(FloatToBf16Bits, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3F80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one (1).
  EXPECT_EQ(FloatToBf16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to the even 1 + 2^-6.
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(FloatToBf16Bits(NAN) & 0x7FC0, 0x7FC0);
}

// The data section must be tiled: a hole between tensors, before the first
// or after the last is a misplaced offset or appended bytes, refused naming
// the bytes.
TEST(SafetensorsReader, RefusesBytesThatBelongToNoTensor) {
  const struct {
    const char* name;
    std::string header;
    size_t data;
    std::string want;
  } cases[] = {
      {"gap.safetensors",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
       20, "bytes [8, 12) of the data section belong to no tensor (a gap before tensor b)"},
      {"lead.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       "bytes [0, 4) of the data section belong to no tensor (a gap before tensor a)"},
      {"tail.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12,
       "bytes [8, 12) of the data section belong to no tensor (past the last one)"},
      {"none.safetensors", R"({"__metadata__":{"format":"pt"}})", 4,
       "bytes [0, 4) of the data section belong to no tensor (past the last one)"},
      // The name is escaped: one line whatever it holds (tests/fuzz found a NUL).
      {"nul.safetensors", R"({"a\u0000\nb":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       "bytes [0, 4) of the data section belong to no tensor (a gap before tensor a\\x00\\nb)"},
  };
  for (const auto& c : cases) {
    const std::string path = WriteRaw(c.name, c.header, std::string(c.data, '\0'));
    auto r = SafetensorsReader::Open(path);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(path + ": " + c.want), std::string::npos) << r.status();
  }
}

TEST(SafetensorsReader, AcceptsAPaddedHeaderAndEmptyTensorsBetweenOthers) {
  // The header may end in spaces (writers pad it to 8 bytes); an empty
  // tensor sits at the offset where it falls, as safetensors writes it.
  const std::string path = WriteRaw(
      "tiled.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}}     )",
      std::string(14, '\0'));
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->entries().size(), 3u);
}

TEST(SafetensorsStreamWriter, WritesFilesItsReaderAccepts) {
  // Odd sizes, so that no tensor ends on an 8-byte boundary: the writer
  // leaves no padding between tensors, which the reader would refuse.
  for (StoredDType dtype : {StoredDType::kF32, StoredDType::kBF16}) {
    const std::string path = ::testing::TempDir() + "/written.safetensors";
    const std::vector<float> a = {1, 2, 3}, b = {4}, c = {5, 6, 7, 8, 9};
    {
      auto w = SafetensorsStreamWriter::Create(path, {{"a", {3}}, {"e", {0}}, {"b", {1, 1}}, {"c", {5}}}, dtype);
      ASSERT_TRUE(w.ok()) << w.status();
      for (const auto* v : {&a, &b, &c}) ASSERT_TRUE((*w)->Append(v->data(), static_cast<int64_t>(v->size())).ok());
      ASSERT_TRUE((*w)->Finish().ok());
    }
    auto r = SafetensorsReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    float got[5];
    ASSERT_TRUE((*r)->ReadFloats("c", 0, 5, got).ok());
    EXPECT_EQ(got[4], 9.0f);
  }
}

TEST(SafetensorsReader, RefusesADirectoryOrAFifoWithoutBlocking) {
  EXPECT_NE(SafetensorsReader::Open(::testing::TempDir()).status().message().find("not a regular file"),
            std::string::npos);
  const std::string fifo = ::testing::TempDir() + "/weights.fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // No writer ever opens it: a blocking open would hang here.
  auto r = SafetensorsReader::Open(fifo);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(fifo + ": not a regular file"), std::string::npos) << r.status();
  std::remove(fifo.c_str());
}

}  // namespace
}  // namespace shardline
