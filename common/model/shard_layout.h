// ShardLayout: where every element of one unit's FlatParam lives, for one
// shard group size. A pure function of (parameter shapes, group size): the
// coordinator publishes it (the ownership map), checkpoints record it, and
// every rank computes the same answer without talking to anyone.
//
// The flat buffer is the unit's parameters back to back in declaration order,
// followed by zero padding so that its length divides by the group size
// (sizes that do not divide are padded, never rejected). Rank r of the group
// owns [r * shard_numel, (r + 1) * shard_numel).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline {

struct ParamSpec {
  std::string name;              // nanoGPT's name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;    // as nn.Linear stores it ([out, in])
  bool decay = false;            // weight decay applies (tensors of two or more dimensions)
  int64_t numel() const;
};

struct ParamSlot {
  ParamSpec spec;
  int64_t offset = 0;  // first element in the unsharded flat buffer
};

// One rank's part of a parameter: the elements [param_begin, param_end) of
// the flattened parameter sit at [shard_begin, ...) of that rank's shard.
struct ShardPiece {
  int param_index = 0;
  int64_t param_begin = 0;
  int64_t param_end = 0;
  int64_t shard_begin = 0;
};

struct ShardLayout {
  std::string unit;             // "embed", "h.3", "head"
  std::vector<ParamSlot> params;
  int group_size = 1;
  int64_t numel = 0;            // sum of parameter sizes
  int64_t padded_numel = 0;     // numel rounded up to a multiple of group_size
  int64_t shard_numel = 0;      // padded_numel / group_size

  int64_t ShardOffset(int rank) const { return rank * shard_numel; }
  // The pieces of every parameter that fall into `rank`'s shard, in order.
  std::vector<ShardPiece> PiecesOf(int rank) const;
};

// Builds the layout; fails (naming the unit) on an empty unit, a parameter
// with a non-positive dimension, or group_size < 1.
absl::StatusOr<ShardLayout> MakeShardLayout(const std::string& unit,
                                            std::vector<ParamSpec> params,
                                            int group_size);

}  // namespace shardline
