// ShardLayout: padding when sizes do not divide, ownership, and pieces.
#include "common/model/shard_layout.h"

#include <gtest/gtest.h>

namespace shardline {
namespace {

std::vector<ParamSpec> Specs() {
  return {{"a", {3, 5}, true}, {"b", {7}, false}, {"c", {2, 2}, true}};  // 15 + 7 + 4 = 26
}

TEST(ShardLayout, PadsToAMultipleOfTheGroupSize) {
  auto l = MakeShardLayout("u", Specs(), 3);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->numel, 26);
  EXPECT_EQ(l->padded_numel, 27);
  EXPECT_EQ(l->shard_numel, 9);
  EXPECT_EQ(l->params[1].offset, 15);
  EXPECT_EQ(l->params[2].offset, 22);
  EXPECT_EQ(l->ShardOffset(2), 18);
}

TEST(ShardLayout, NoPaddingWhenSizesDivide) {
  auto l = MakeShardLayout("u", Specs(), 2);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->padded_numel, 26);
  EXPECT_EQ(l->shard_numel, 13);
}

TEST(ShardLayout, PiecesCoverEveryElementExactlyOnce) {
  for (int g : {1, 2, 3, 4, 5, 7, 26, 30}) {
    auto l = MakeShardLayout("u", Specs(), g);
    ASSERT_TRUE(l.ok());
    std::vector<int> seen(26, 0);
    for (int r = 0; r < g; ++r) {
      for (const ShardPiece& p : l->PiecesOf(r)) {
        EXPECT_LE(p.shard_begin + (p.param_end - p.param_begin), l->shard_numel);
        for (int64_t i = p.param_begin; i < p.param_end; ++i) seen[l->params[p.param_index].offset + i]++;
        // The piece sits where the flat offset says it does.
        EXPECT_EQ(l->ShardOffset(r) + p.shard_begin, l->params[p.param_index].offset + p.param_begin);
      }
    }
    for (int i = 0; i < 26; ++i) EXPECT_EQ(seen[i], 1) << "element " << i << " group " << g;
  }
}

TEST(ShardLayout, RejectsBadInputNamingTheUnit) {
  auto zero = MakeShardLayout("h.3", Specs(), 0);
  EXPECT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("h.3"), std::string::npos);
  auto empty = MakeShardLayout("head", {}, 2);
  EXPECT_NE(empty.status().message().find("head"), std::string::npos);
  auto neg = MakeShardLayout("embed", {{"w", {4, 0}, true}}, 2);
  EXPECT_NE(neg.status().message().find("w"), std::string::npos);
}

}  // namespace
}  // namespace shardline
