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

Nf4Tables::Nf4Tables(const at::Device& device) {
  const std::array<float, 16>& code = Nf4Codes();
  at::Tensor pairs = at::empty({256, 2}, at::kFloat);
  float* p = pairs.data_ptr<float>();
  for (int b = 0; b < 256; ++b) p[2 * b] = code[b >> 4], p[2 * b + 1] = code[b & 0x0F];
  const std::array<float, 256>& scales = DynamicMap::Signed().codes();
  pairs_ = pairs.to(device);
  scale_codes_ = at::from_blob(const_cast<float*>(scales.data()), {256}, at::kFloat).clone().to(device);
}

void DequantizeNf4Into(const Nf4Tensor& t, const Nf4Tables& tables, at::Tensor out) {
  const int64_t nb = t.qabsmax.numel(), k = Nf4Tensor::kBlockNumel;
  // The blocks' absmax: code8[q] * scale, then + offset (dequantize_blockwise,
  // then the offset), one fp32 rounding each.
  const at::Tensor scale = t.absmax2.repeat_interleave(Nf4Tensor::kScaleBlock).narrow(0, 0, nb);
  at::Tensor absmax = tables.scale_codes().index_select(0, t.qabsmax.to(at::kInt)).mul_(scale);
  absmax.add_(at::scalar_tensor(t.offset, at::kFloat).to(absmax.device()));
  // Each value: nf4[code] * its block's absmax, one fp32 product, in chunks
  // of blocks so that the fp32 temporaries stay small beside the matrix.
  constexpr int64_t kChunkBlocks = 4096;
  for (int64_t b0 = 0; b0 < nb; b0 += kChunkBlocks) {
    const int64_t first = b0 * k, numel = std::min(t.numel, (b0 + kChunkBlocks) * k) - first;
    const at::Tensor bytes = t.packed.narrow(0, first / 2, (numel + 1) / 2).to(at::kInt);
    const at::Tensor x = tables.pairs().index_select(0, bytes).view({-1});
    const int64_t full = numel / k * k, rem = numel - full;
    at::Tensor o = out.narrow(0, first, numel);
    if (full > 0) {
      o.narrow(0, 0, full).view({full / k, k}).copy_(x.narrow(0, 0, full).view({full / k, k}) *
                                                     absmax.narrow(0, b0, full / k).unsqueeze(1));
    }
    if (rem > 0) o.narrow(0, full, rem).copy_(x.narrow(0, full, rem) * absmax.narrow(0, nb - 1, 1));
  }
}

at::Tensor DequantizeNf4(const Nf4Tensor& t, at::ScalarType dtype) {
  at::Tensor out = at::empty({t.numel}, t.packed.options().dtype(dtype));
  DequantizeNf4Into(t, Nf4Tables(t.packed.device()), out);
  return out;
}

}  // namespace shardline
