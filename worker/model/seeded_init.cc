#include "worker/model/seeded_init.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <ATen/CPUGeneratorImpl.h>

namespace shardline {
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

at::Generator SeededGenerator(const std::string& name, uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed ^ (Fnv1a(name) * 0x9E3779B97F4A7C15ull));
}

// The end of the piece that starts at `begin` of a parameter of `numel`:
// kPiece on, unless what would remain is under 16 (ATen's tail of the last
// 16 redrawn must fall in one call).
int64_t PieceEnd(int64_t begin, int64_t numel) {
  const int64_t end = begin + SeededUnitValues::kPiece;
  return end + 16 > numel ? numel : end;
}

}  // namespace

ParamInit AdapterInitOf(const ParamSpec& p) {
  if (p.name.find(".lora_A.") == std::string::npos) return {};
  return {ParamInit::Kind::kUniform, 1.0 / std::sqrt(static_cast<double>(p.shape[1]))};
}

SeededUnitValues::SeededUnitValues(ShardLayout layout, uint64_t seed, ParamInitOf init_of)
    : layout_(std::move(layout)), seed_(seed) {
  static_assert(kPiece % 16 == 0, "a piece is whole 16-element blocks");
  for (const ParamSlot& slot : layout_.params) inits_.push_back(init_of(slot.spec));
  streams_.resize(layout_.params.size());
  for (size_t i = 0; i < streams_.size(); ++i) Restart(i);
}

void SeededUnitValues::Restart(size_t i) {
  Stream& s = streams_[i];
  s.generator = SeededGenerator(layout_.params[i].spec.name, seed_);
  s.piece = at::Tensor();
  s.piece_begin = s.next = 0;
}

const SeededUnitValues::Stream& SeededUnitValues::PieceHolding(size_t i, int64_t at) {
  Stream& s = streams_[i];
  if (s.piece.defined() && at >= s.piece_begin && at < s.piece_begin + s.piece.numel()) return s;
  if (at < s.next) Restart(i);
  const int64_t numel = layout_.params[i].spec.numel();
  const ParamInit& init = inits_[i];
  while (true) {
    const int64_t begin = s.next, end = PieceEnd(begin, numel);
    if (!s.piece.defined() || s.piece.numel() != end - begin) s.piece = at::empty({end - begin}, at::kFloat);
    if (init.kind == ParamInit::Kind::kNormal) {
      s.piece.normal_(0.0, init.scale, s.generator);
    } else {
      s.piece.uniform_(-init.scale, init.scale, s.generator);
    }
    s.piece_begin = begin;
    s.next = end;
    if (at < end) return s;
  }
}

void SeededUnitValues::Fill(int64_t begin, at::Tensor out) {
  out.zero_();
  const int64_t end = begin + out.numel();
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    const ParamSlot& slot = layout_.params[i];
    const int64_t lo = std::max(begin, slot.offset), hi = std::min(end, slot.offset + slot.spec.numel());
    if (lo >= hi) continue;
    at::Tensor dst = out.narrow(0, lo - begin, hi - lo);
    switch (inits_[i].kind) {
      case ParamInit::Kind::kZero: break;
      case ParamInit::Kind::kOnes: dst.fill_(1.0); break;
      case ParamInit::Kind::kNormal:
      case ParamInit::Kind::kUniform:
        for (int64_t at = lo; at < hi;) {
          const Stream& s = PieceHolding(i, at - slot.offset);
          const int64_t piece_lo = s.piece_begin + slot.offset;
          const int64_t n = std::min(hi, piece_lo + s.piece.numel()) - at;
          dst.narrow(0, at - lo, n).copy_(s.piece.narrow(0, at - piece_lo, n));
          at += n;
        }
        // Done with it, unless a later range asks again.
        if (hi == slot.offset + slot.spec.numel()) streams_[i].piece = at::Tensor();
        break;
    }
  }
}

}  // namespace shardline
