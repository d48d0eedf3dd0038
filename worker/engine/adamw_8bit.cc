#include "worker/engine/adamw_8bit.h"

#include <algorithm>
#include <cmath>

namespace shardline {
namespace {

constexpr int kCells = 65536;

// A normalized value's 16-bit cell, in fp32 as bitsandbytes computes it
// (the engine's flags keep the compiler from fusing it into an FMA).
int CellOf(float x) {
  x = std::min(1.0f, std::max(-1.0f, x));
  return static_cast<int>(((x + 1.0f) * 0.5f) * 65535.0f + 0.5f);
}

}  // namespace

DynamicMap::DynamicMap(bool is_signed) : cells_(kCells) {
  // create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8), op
  // for op: for exponents 10^-6 .. 10^0, the midpoints of an fp32 linspace
  // over [0.1, 1] (2^i + 1 points signed, 2^(i+1) + 1 unsigned), scaled, and
  // their negatives where signed; then 0 and 1, sorted.
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = (int64_t{1} << (is_signed ? i : i + 1)) + 1;
    const at::Tensor b = at::linspace(0.1, 1.0, items, at::kFloat);
    const at::Tensor means = (b.narrow(0, 0, items - 1) + b.narrow(0, 1, items - 1)).div(2.0);
    const double scale = std::pow(10.0, -6 + i);
    for (const double sign : {1.0, -1.0}) {
      if (sign < 0 && !is_signed) break;
      const at::Tensor v = means.mul(sign * scale).contiguous();
      data.insert(data.end(), v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  data.resize(256, 0.0f);
  std::sort(data.begin(), data.end());
  std::copy(data.begin(), data.end(), codes_.begin());
  // Each cell's code: the one nearest the cell's value, the lower of two as near.
  for (int j = 0; j < kCells; ++j) {
    const float g = (static_cast<float>(j) / 65535.0f) * 2.0f - 1.0f;
    int idx = static_cast<int>(std::upper_bound(codes_.begin(), codes_.end(), g) - codes_.begin()) - 1;
    idx = std::clamp(idx, 0, 255);
    if (idx < 255 && std::fabs(g - codes_[idx + 1]) < std::fabs(g - codes_[idx])) ++idx;
    cells_[j] = static_cast<uint8_t>(idx);
  }
}

const DynamicMap& DynamicMap::Signed() {
  static const DynamicMap* const map = new DynamicMap(true);
  return *map;
}

const DynamicMap& DynamicMap::Unsigned() {
  static const DynamicMap* const map = new DynamicMap(false);
  return *map;
}

uint8_t DynamicMap::Index(float x) const { return cells_[CellOf(x)]; }

void DynamicMap::QuantizeBlock(const float* x, int64_t n, uint8_t* q, float* absmax) const {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  *absmax = m;
  const float inv = 1.0f / m;  // (a zero block: every index reads back as 0 * code)
  for (int64_t i = 0; i < n; ++i) q[i] = Index(x[i] * inv);
}

void DynamicMap::DequantizeBlock(const uint8_t* q, int64_t n, float absmax, float* x) const {
  for (int64_t i = 0; i < n; ++i) x[i] = codes_[q[i]] * absmax;
}

AdamW8BitState::AdamW8BitState(const ShardLayout& layout, int64_t first, int64_t count, const Allocate& allocate)
    : count_(count), blocks_(CutMomentBlocks(layout, first, count)) {
  for (int k = 0; k < 2; ++k) {
    codes_[k] = allocate(blocks_.quantized, at::kByte);
    absmax_[k] = allocate(blocks_.blocks, at::kFloat);
    dense_[k] = allocate(blocks_.dense, at::kFloat);
  }
}

int64_t AdamW8BitState::ChunkEnd(const MomentSegment& s, int64_t pos) {
  if (!s.quantized) return std::min(s.end, pos + kChunkBlocks * MomentBlocks::kBlockNumel);
  int64_t lo = 0, hi = 0;
  MomentBlocks::BlockBounds(s, std::min(MomentBlocks::BlockOf(s, pos) + kChunkBlocks - 1, s.first_block + s.blocks - 1),
                            &lo, &hi);
  return hi;
}

void AdamW8BitState::Dequantize(int k, const MomentSegment& s, int64_t from, int64_t to, float* out) const {
  const DynamicMap& map = k == 0 ? DynamicMap::Signed() : DynamicMap::Unsigned();
  const uint8_t* codes = codes_[k].data_ptr<uint8_t>() + s.storage - s.begin;
  const float* absmax = absmax_[k].data_ptr<float>();
  for (int64_t b = MomentBlocks::BlockOf(s, from); from < to; ++b) {
    int64_t lo = 0, hi = 0;
    MomentBlocks::BlockBounds(s, b, &lo, &hi);
    map.DequantizeBlock(codes + lo, hi - lo, absmax[b], out);
    out += hi - lo;
    from = hi;
  }
}

void AdamW8BitState::Quantize(int k, const MomentSegment& s, int64_t from, int64_t to, const float* in) {
  const DynamicMap& map = k == 0 ? DynamicMap::Signed() : DynamicMap::Unsigned();
  uint8_t* codes = codes_[k].data_ptr<uint8_t>() + s.storage - s.begin;
  float* absmax = absmax_[k].data_ptr<float>();
  for (int64_t b = MomentBlocks::BlockOf(s, from); from < to; ++b) {
    int64_t lo = 0, hi = 0;
    MomentBlocks::BlockBounds(s, b, &lo, &hi);
    map.QuantizeBlock(in, hi - lo, codes + lo, &absmax[b]);
    in += hi - lo;
    from = hi;
  }
}

void AdamW8BitState::Update(const AdamWStep& s, const at::Tensor& param, const at::Tensor& grad,
                            const at::Tensor& clip_coef) {
  const double step = static_cast<double>(s.step);
  const double bc1 = 1.0 - std::pow(s.beta1, step), bc2 = std::sqrt(1.0 - std::pow(s.beta2, step));
  // Every op is elementwise, so a segment goes in chunks (whole blocks of
  // quantized ones): the fp32 temporaries stay a few hundred KiB whatever
  // the tensor, with the same results as bitsandbytes' whole-tensor ops.
  for (const MomentSegment& seg : blocks_.segments) {
    for (int64_t pos = seg.begin; pos < seg.end;) {
      const int64_t end = ChunkEnd(seg, pos);
      const int64_t n = end - pos;
      at::Tensor p = param.narrow(0, pos, n);
      at::Tensor pf = p.scalar_type() == at::kFloat ? p : p.to(at::kFloat);
      // clip_grad_norm_'s multiply (in the gradient's dtype), then
      // bitsandbytes' g.float() (its gnorm_scale is 1).
      const at::Tensor g = grad.narrow(0, pos, n).mul(clip_coef).to(at::kFloat);
      const double wd = seg.decay ? s.weight_decay : 0.0;
      if (seg.quantized) {
        at::Tensor m = at::empty({n}, at::kFloat), v = at::empty({n}, at::kFloat);
        Dequantize(0, seg, pos, end, m.data_ptr<float>());
        Dequantize(1, seg, pos, end, v.data_ptr<float>());
        m.mul_(s.beta1).add_(g, 1.0 - s.beta1);
        v.mul_(s.beta2).addcmul_(g, g, 1.0 - s.beta2);
        const at::Tensor denom = v.sqrt().div(bc2).add_(s.eps);
        if (wd > 0.0) pf.mul_(1.0 - s.lr * wd);
        pf.addcdiv_(m, denom, -s.lr / bc1);
        Quantize(0, seg, pos, end, m.data_ptr<float>());
        Quantize(1, seg, pos, end, v.data_ptr<float>());
      } else {
        const int64_t k = seg.storage + (pos - seg.begin);
        at::Tensor m = dense_[0].narrow(0, k, n), v = dense_[1].narrow(0, k, n);
        m.mul_(s.beta1).add_(g, 1.0 - s.beta1);
        v.mul_(s.beta2).addcmul_(g, g, 1.0 - s.beta2);
        const double step_size = -s.lr * bc2 / bc1;
        if (wd > 0.0) pf.mul_(1.0 - s.lr * wd);
        pf.add_(m.div(v.sqrt().add(s.eps * bc2)), step_size);
      }
      if (!pf.is_same(p)) p.copy_(pf);
      pos = end;
    }
  }
}

at::Tensor AdamW8BitState::Values(int k) const {
  at::Tensor out = at::zeros({count_}, at::kFloat);
  for (const MomentSegment& s : blocks_.segments) {
    if (s.quantized) {
      Dequantize(k, s, s.begin, s.end, out.data_ptr<float>() + s.begin);
    } else {
      out.narrow(0, s.begin, s.end - s.begin).copy_(dense_[k].narrow(0, s.storage, s.end - s.begin));
    }
  }
  return out;
}

void AdamW8BitState::Load(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  const at::Tensor in[2] = {exp_avg.to(at::kFloat).contiguous(), exp_avg_sq.to(at::kFloat).contiguous()};
  for (int k = 0; k < 2; ++k) {
    for (const MomentSegment& s : blocks_.segments) {
      if (s.quantized) {
        Quantize(k, s, s.begin, s.end, in[k].data_ptr<float>() + s.begin);
      } else {
        dense_[k].narrow(0, s.storage, s.end - s.begin).copy_(in[k].narrow(0, s.begin, s.end - s.begin));
      }
    }
  }
}

AdamWState::Encoded AdamW8BitState::Encode() const {
  return {{"exp_avg.q8", codes_[0]}, {"exp_avg.absmax", absmax_[0]},
          {"exp_avg_sq.q8", codes_[1]}, {"exp_avg_sq.absmax", absmax_[1]}};
}

bool AdamW8BitState::LoadEncoded(const Encoded& encoded) {
  const Encoded mine = Encode();
  if (encoded.size() != mine.size()) return false;
  for (size_t i = 0; i < mine.size(); ++i) {
    const at::Tensor& t = encoded[i].second;
    if (encoded[i].first != mine[i].first || t.scalar_type() != mine[i].second.scalar_type() ||
        t.numel() != mine[i].second.numel()) {
      return false;
    }
  }
  for (size_t i = 0; i < mine.size(); ++i) mine[i].second.copy_(encoded[i].second.reshape({-1}));
  return true;
}

}  // namespace shardline
