#include "common/model/nf4_layout.h"

namespace shardline {

bool IsNf4Matrix(const ParamSpec& p) { return p.shape.size() == 2; }

Nf4Split SplitNf4Matrices(std::vector<ParamSpec> params) {
  Nf4Split out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (IsNf4Matrix(params[i])) {
      out.matrices.push_back(std::move(params[i]));
      out.matrix_index.push_back(static_cast<int>(i));
    } else {
      out.dense.push_back(std::move(params[i]));
    }
  }
  return out;
}

Nf4Layout MakeNf4Layout(const std::vector<int64_t>& numels, int group_size) {
  Nf4Layout l;
  l.group_size = group_size;
  for (int64_t n : numels) {
    Nf4Placement p;
    p.numel = n;
    p.first_block = l.blocks, p.blocks = (n + Nf4Layout::kBlockNumel - 1) / Nf4Layout::kBlockNumel;
    p.first_scale = l.scales, p.scales = (p.blocks + Nf4Layout::kScaleBlock - 1) / Nf4Layout::kScaleBlock;
    p.value_offset = l.numel;
    l.blocks += p.blocks, l.scales += p.scales, l.numel += n;
    l.matrices.push_back(p);
  }
  l.piece_blocks = (l.blocks + group_size - 1) / group_size;
  return l;
}

}  // namespace shardline
