#include "common/model/table_shard.h"

#include <algorithm>

namespace shardline {
namespace {
int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }
}  // namespace

TableShard TableShard::Of(int64_t table_offset, int64_t rows, int64_t width, int64_t shard_begin,
                          int64_t shard_numel) {
  const int64_t c = width;
  const int64_t begin = shard_begin - table_offset, end = begin + shard_numel;  // the shard, in table elements
  TableShard h;
  h.full_lo = std::clamp<int64_t>(CeilDiv(begin, c), 0, rows);
  h.full_hi = std::clamp<int64_t>(FloorDiv(end, c), h.full_lo, rows);
  h.full_at = h.full_lo * c - begin;
  auto part = [&](int64_t row) {
    if (row < 0 || row >= rows) return;
    const int64_t first = std::max(row * c, begin), last = std::min((row + 1) * c, end);
    if (last <= first || (first == row * c && last == (row + 1) * c)) return;  // none, or whole
    h.parts.push_back({row, first - row * c, last - first, first - begin});
  };
  part(FloorDiv(begin, c));
  if (FloorDiv(end - 1, c) != FloorDiv(begin, c)) part(FloorDiv(end - 1, c));
  return h;
}

TableShard::Range TableShard::PartOf(const ShardLayout& layout, int replicas, int k) {
  const int64_t part = CeilDiv(layout.shard_numel, replicas), r = k % replicas;
  const int64_t begin = std::min(r * part, layout.shard_numel);
  return {layout.ShardOffset(k / replicas) + begin, std::min(part, layout.shard_numel - begin)};
}

TableShard TableShard::Of(const ShardLayout& layout, int param, int k, int replicas) {
  const ParamSlot& slot = layout.params.at(param);
  const Range range = PartOf(layout, replicas, k);
  return Of(slot.offset, slot.spec.shape.at(0), slot.spec.shape.at(1), range.begin, range.numel);
}

std::vector<int64_t> TableShard::CutRows(const ShardLayout& layout, int param, int replicas) {
  std::vector<int64_t> rows;
  for (int k = 0; k < layout.group_size * replicas; ++k) {
    for (const PartRow& p : Of(layout, param, k, replicas).parts) rows.push_back(p.row);
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

}  // namespace shardline
