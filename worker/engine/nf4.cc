#include "worker/engine/nf4.h"

#include <tuple>

#include "worker/engine/adamw_8bit.h"

namespace shardline {

const std::array<float, 16>& Nf4Codes() {
  // QLoRA's NF4 (create_normal_map(offset=0.9677083, use_extra_value=True)),
  // as the fp32 values bitsandbytes' table holds.
  static const std::array<float, 16> codes = {
      -0x1.0000000p+0f, -0x1.6473620p-1f, -0x1.0cd6600p-1f, -0x1.9465400p-2f, -0x1.23449a0p-2f, -0x1.7a6a7e0p-3f,
      -0x1.74f0e20p-4f, 0.0f,             0x1.45f5fe0p-4f,  0x1.4995c60p-3f,  0x1.f809ba0p-3f,  0x1.5a06740p-2f,
      0x1.c349700p-2f,  0x1.200f560p-1f,  0x1.7227660p-1f,  0x1.0000000p+0f};
  return codes;
}

Nf4Tensor QuantizeNf4(const at::Tensor& values) {
  const at::Tensor a = values.reshape({-1}).to(at::kFloat).contiguous();
  const int64_t n = a.numel(), k = Nf4Tensor::kBlockNumel;
  const int64_t rem = n % k, full = n - rem, blocks = full / k;
  // bitsandbytes' default quantize_4bit, op for op.
  const at::Tensor whole = a.narrow(0, 0, full).reshape({blocks, k});
  at::Tensor absmax = std::get<0>(whole.abs().max(-1));
  at::Tensor scaled = at::clamp(whole * absmax.clamp_min(1e-38).reciprocal().view({-1, 1}), -1, 1).reshape({-1});
  if (rem > 0) {
    const at::Tensor tail = a.narrow(0, full, rem);
    const at::Tensor am = tail.abs().max().clamp_min(1e-38);
    absmax = at::cat({absmax, am.unsqueeze(0)});
    scaled = at::cat({scaled, at::clamp(tail / am, -1, 1)});
  }
  if (scaled.numel() % 2 != 0) scaled = at::cat({scaled, at::zeros({1}, scaled.options())});
  const at::Tensor code = at::from_blob(const_cast<float*>(Nf4Codes().data()), {16}, at::kFloat);
  const at::Tensor bounds = (code.narrow(0, 0, 15) + code.narrow(0, 1, 15)) / 2;
  const at::Tensor q = at::bucketize(scaled, bounds, /*out_int32=*/true).to(at::kByte);
  Nf4Tensor out;
  out.numel = n;
  out.packed = q.slice(0, 0, q.numel(), 2).bitwise_left_shift(4).bitwise_or(q.slice(0, 1, q.numel(), 2));
  // The second quantization (quantize_4bit's compress_statistics).
  const at::Tensor centred = (absmax - absmax.mean()).contiguous();
  out.offset = absmax.mean().item<float>();
  const int64_t nb = centred.numel(), scales = (nb + Nf4Tensor::kScaleBlock - 1) / Nf4Tensor::kScaleBlock;
  out.qabsmax = at::empty({nb}, at::kByte);
  out.absmax2 = at::empty({scales}, at::kFloat);
  for (int64_t s = 0; s < scales; ++s) {
    const int64_t lo = s * Nf4Tensor::kScaleBlock, len = std::min(Nf4Tensor::kScaleBlock, nb - lo);
    DynamicMap::Signed().QuantizeBlock(centred.data_ptr<float>() + lo, len, out.qabsmax.data_ptr<uint8_t>() + lo,
                                       out.absmax2.data_ptr<float>() + s);
  }
  return out;
}

at::Tensor DequantizeNf4(const Nf4Tensor& t, at::ScalarType dtype) {
  const int64_t nb = t.qabsmax.numel();
  at::Tensor absmax = at::empty({nb}, at::kFloat);
  for (int64_t lo = 0; lo < nb; lo += Nf4Tensor::kScaleBlock) {
    DynamicMap::Signed().DequantizeBlock(t.qabsmax.data_ptr<uint8_t>() + lo, std::min(Nf4Tensor::kScaleBlock, nb - lo),
                                         t.absmax2.data_ptr<float>()[lo / Nf4Tensor::kScaleBlock],
                                         absmax.data_ptr<float>() + lo);
  }
  absmax.add_(at::scalar_tensor(t.offset, at::kFloat));
  at::Tensor out = at::empty({t.numel}, at::kFloat);
  const uint8_t* packed = t.packed.data_ptr<uint8_t>();
  const float* scale = absmax.data_ptr<float>();
  float* x = out.data_ptr<float>();
  const std::array<float, 16>& code = Nf4Codes();
  for (int64_t i = 0; i < t.numel; ++i) {
    const uint8_t byte = packed[i / 2];
    x[i] = code[i % 2 == 0 ? byte >> 4 : byte & 0x0F] * scale[i / Nf4Tensor::kBlockNumel];
  }
  return out.to(dtype);
}

}  // namespace shardline
