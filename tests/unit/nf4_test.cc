// NF4 with double-quantized scales against bitsandbytes' quantize_4bit and
// dequantize_4bit (tests/unit/data/make_nf4.py), bitwise.
#include "worker/engine/nf4.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "tests/unit/recorded_data.h"

namespace shardline {
namespace {

// An fp32 tensor of 19237 values (a partial last block, an odd count) and a
// bf16 one: codes, scales, offset and the dequantized values all bitwise.
TEST(Nf4, QuantizesAndDequantizesAsBitsandbytes) {
  const RecordedFile read("nf4.safetensors");
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
