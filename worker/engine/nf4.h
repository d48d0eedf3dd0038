// NF4: QLoRA's 4-bit NormalFloat storage of a frozen weight, with blocks of
// 64 and double-quantized scales, as bitsandbytes computes it on the CPU
// (quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True)
// and dequantize_4bit; tests/unit/data/make_nf4.py records bitsandbytes 0.50).
//
// Quantizing a tensor of n values (in fp32):
//  - per block of 64 (the last may be partial), absmax = max |x|; each
//    x * (1 / absmax) (the partial block: x / absmax), clamped to [-1, 1],
//    becomes the index of the nearest NF4 code (ties to the lower: the
//    midpoints between codes, torch.bucketize), two a byte, the first in the
//    high nibble (an odd count is padded with a 0 code);
//  - the blocks' absmax, less their mean (the offset), are quantized again
//    as 8-bit blockwise over bitsandbytes' signed dynamic map, blocks of 256
//    (DynamicMap, adamw_8bit.h): about 0.51 bytes a value in all.
// Dequantizing: absmax = code8[q] * scale + offset, then x = nf4[q] * absmax,
// in fp32, rounded into the requested dtype.
//
// The offset is the mean over the whole tensor's blocks, so quantizing needs
// the whole tensor's block maxima (a rank quantizing only its range needs the
// others' maxima to equal bitsandbytes). Quantizing runs on the host;
// dequantizing is tensor ops on the tensors' device (the same fp32 products
// on every device). Pure functions; any thread.
#pragma once

#include <array>
#include <cstdint>

#include <ATen/ATen.h>

#include "common/model/nf4_layout.h"

namespace shardline {

struct Nf4Tensor {
  static constexpr int64_t kBlockNumel = Nf4Layout::kBlockNumel;
  static constexpr int64_t kScaleBlock = Nf4Layout::kScaleBlock;  // blocks per scale of the second quantization
  int64_t numel = 0;
  at::Tensor packed;   // uint8 [ceil(numel / 2)]
  at::Tensor qabsmax;  // uint8 [blocks]: the blocks' absmax less `offset`, 8-bit
  at::Tensor absmax2;  // fp32 [ceil(blocks / 256)]: that quantization's scales
  float offset = 0;    // the mean of the blocks' absmax
  int64_t bytes() const { return packed.nbytes() + qabsmax.nbytes() + absmax2.nbytes() + 4; }
};

// The 16 NF4 codes (QLoRA's NormalFloat), ascending, as bitsandbytes holds them.
const std::array<float, 16>& Nf4Codes();

// `values`: any floating dtype, any shape (flattened), on the host.
Nf4Tensor QuantizeNf4(const at::Tensor& values);

// The lookup tables dequantizing reads, on one device.
class Nf4Tables {
 public:
  explicit Nf4Tables(const at::Device& device);
  // fp32 [256, 2]: a packed byte's two values, high nibble first.
  const at::Tensor& pairs() const { return pairs_; }
  // fp32 [256]: the signed dynamic map the scales are quantized over.
  const at::Tensor& scale_codes() const { return scale_codes_; }

 private:
  at::Tensor pairs_, scale_codes_;
};

// Writes t's values into `out` ([t.numel], any floating dtype, on the tables'
// and t's device), rounded from fp32 as bitsandbytes' dequantize_4bit does.
void DequantizeNf4Into(const Nf4Tensor& t, const Nf4Tables& tables, at::Tensor out);
// [numel] in `dtype`, on t's device.
at::Tensor DequantizeNf4(const Nf4Tensor& t, at::ScalarType dtype);

}  // namespace shardline
