// NF4 with double-quantized scales against bitsandbytes' quantize_4bit and
// dequantize_4bit (tests/unit/data/make_nf4.py), bitwise.
#include "worker/engine/nf4.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/model/safetensors.h"

namespace shardline {
namespace {

// A recorded tensor as fp32 (its values exactly: the file's uint8 as
// integers, bf16 widened).
class Nf4Recorded {
 public:
  Nf4Recorded() {
    auto file = SafetensorsReader::Open(std::string(SHARDLINE_TEST_DATA) + "/nf4.safetensors");
    EXPECT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file);
  }
  at::Tensor Floats(const std::string& name) const {
    const int64_t n = file_->entries().at(name).numel();
    at::Tensor t = at::empty({n}, at::kFloat);
    EXPECT_TRUE(file_->ReadFloats(name, 0, n, t.data_ptr<float>()).ok()) << name;
    return t;
  }
  at::Tensor Bytes(const std::string& name) const {
    std::string raw;
    EXPECT_TRUE(file_->ReadRaw(name, "U8", &raw).ok()) << name;
    at::Tensor t = at::empty({static_cast<int64_t>(raw.size())}, at::kByte);
    std::memcpy(t.data_ptr(), raw.data(), raw.size());
    return t;
  }

 private:
  std::unique_ptr<SafetensorsReader> file_;
};

// An fp32 tensor of 19237 values (a partial last block, an odd count) and a
// bf16 one: codes, scales, offset and the dequantized values all bitwise.
TEST(Nf4, QuantizesAndDequantizesAsBitsandbytes) {
  const Nf4Recorded read;
  for (const auto& [name, dtype] : {std::pair<std::string, at::ScalarType>{"f32", at::kFloat}, {"bf16", at::kBFloat16}}) {
    const at::Tensor in = read.Floats(name + ".in").to(dtype);
    const Nf4Tensor q = QuantizeNf4(in);
    EXPECT_EQ(q.numel, in.numel());
    EXPECT_TRUE(at::equal(q.packed, read.Bytes(name + ".packed"))) << name;
    EXPECT_TRUE(at::equal(q.qabsmax, read.Bytes(name + ".qabsmax"))) << name;
    EXPECT_TRUE(at::equal(q.absmax2, read.Floats(name + ".absmax2"))) << name;
    EXPECT_EQ(q.offset, read.Floats(name + ".offset")[0].item<float>()) << name;
    const at::Tensor out = DequantizeNf4(q, dtype);
    EXPECT_EQ(out.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(out.to(at::kFloat), read.Floats(name + ".out")))
        << name << ": max diff " << (out.to(at::kFloat) - read.Floats(name + ".out")).abs().max().item<float>();
    // About half a byte a value: 4 bits, a byte a block of 64, a scale a 256 blocks.
    EXPECT_LT(static_cast<double>(q.bytes()) / in.numel(), 0.5 + 1.0 / 64 + 4.0 / (64 * 256) + 0.01);
  }
}

}  // namespace
}  // namespace shardline
