// The safetensors reader refuses headers that would make it read the wrong
// bytes (sizes that disagree with shape x dtype, tensors that overlap), and
// converts 16-bit floats exactly; the writer's bf16 rounds to nearest even.
#include "common/safetensors.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

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

}  // namespace
}  // namespace shardline
