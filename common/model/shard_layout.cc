#include "common/model/shard_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardline {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<ShardLayout> MakeShardLayout(const std::string& unit,
                                            std::vector<ParamSpec> params,
                                            int group_size) {
  if (group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unit ", unit, ": shard group size must be >= 1, got ", group_size));
  }
  if (params.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unit ", unit, " has no parameters"));
  }
  ShardLayout layout;
  layout.unit = unit;
  layout.group_size = group_size;
  int64_t offset = 0;
  for (auto& p : params) {
    for (int64_t d : p.shape) {
      if (d <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("unit ", unit, ": parameter ", p.name, " has a dimension of ", d));
      }
    }
    const int64_t n = p.numel();
    layout.params.push_back(ParamSlot{std::move(p), offset});
    offset += n;
  }
  layout.numel = offset;
  layout.padded_numel = (offset + group_size - 1) / group_size * group_size;
  layout.shard_numel = layout.padded_numel / group_size;
  return layout;
}

std::vector<ShardPiece> ShardLayout::PiecesOf(int rank) const {
  std::vector<ShardPiece> pieces;
  const int64_t lo = ShardOffset(rank);
  const int64_t hi = lo + shard_numel;
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const int64_t p_lo = params[i].offset;
    const int64_t p_hi = p_lo + params[i].spec.numel();
    const int64_t b = std::max(lo, p_lo), e = std::min(hi, p_hi);
    if (b < e) pieces.push_back(ShardPiece{i, b - p_lo, e - p_lo, b - lo});
  }
  return pieces;
}

}  // namespace shardline
