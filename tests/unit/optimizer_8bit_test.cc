// 8-bit Adam moments: where the blocks lie in a shard, bitsandbytes'
// dynamic maps, and AdamW8BitState against bitsandbytes' AdamW8bit.
#include "worker/engine/adamw_8bit.h"

#include <gtest/gtest.h>

#include <cmath>

#include <memory>
#include <string>

#include "common/model/moment_blocks.h"
#include "tests/unit/recorded_data.h"

namespace shardline {
namespace {

// [a: 5000, decay][b: 427][c: 4300]: a and c in 8 bits, b in fp32 (under
// 4096 elements), as tests/unit/data/make_adamw_8bit.py lays them out.
ShardLayout Layout(int group) {
  auto l = MakeShardLayout("u", {{"a", {50, 100}, true}, {"b", {427}, false}, {"c", {4300}, false}}, group);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

TEST(MomentBlocks, TensorsAreCutIntoBlocksFromTheirFirstElementAndAtTheRangesEdges) {
  const ShardLayout one = Layout(1);
  const MomentBlocks all = CutMomentBlocks(one, 0, one.padded_numel);
  ASSERT_EQ(all.segments.size(), 3u);
  EXPECT_EQ(all.quantized, 5000 + 4300);
  EXPECT_EQ(all.dense, 427);
  EXPECT_EQ(all.blocks, 20 + 17);  // ceil(5000 / 256), ceil(4300 / 256)
  EXPECT_FALSE(all.segments[1].quantized);
  EXPECT_TRUE(all.segments[0].decay);
  // A range from a's element 300 to c's element 10: a's blocks 1..19 (its
  // block 1 cut at 300), b whole, c's block 0 cut at 10.
  const MomentBlocks cut = CutMomentBlocks(one, 300, 5000 - 300 + 427 + 10);
  ASSERT_EQ(cut.segments.size(), 3u);
  EXPECT_EQ(cut.segments[0].tensor_first, 300);
  EXPECT_EQ(cut.segments[0].blocks, 19);
  EXPECT_EQ(cut.segments[2].blocks, 1);
  int64_t lo = 0, hi = 0;
  MomentBlocks::BlockBounds(cut.segments[0], 0, &lo, &hi);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 512 - 300);
  MomentBlocks::BlockBounds(cut.segments[0], 18, &lo, &hi);
  EXPECT_EQ(hi, 5000 - 300);  // a's last, partial block
  EXPECT_EQ(hi - lo, 5000 - 19 * 256);
  EXPECT_EQ(MomentBlocks::BlockOf(cut.segments[0], 211), 0);
  EXPECT_EQ(MomentBlocks::BlockOf(cut.segments[0], 212), 1);
  EXPECT_EQ(cut.bytes(), 2 * (4700 + 10) + 8 * (19 + 1) + 8 * 427);
  // Three shards: every element of the parameters in exactly one range.
  const ShardLayout three = Layout(3);
  int64_t elements = 0;
  for (int r = 0; r < 3; ++r) {
    const MomentBlocks b = CutMomentBlocks(three, three.ShardOffset(r), three.shard_numel);
    elements += b.quantized + b.dense;
  }
  EXPECT_EQ(elements, three.numel);
}

TEST(DynamicMap, EqualsBitsandbytesMaps) {
  const RecordedFile file("adamw_8bit.safetensors");
  auto read = [&](const std::string& name) { return file.Floats(name); };
  const at::Tensor q1 = read("qmap1"), q2 = read("qmap2");
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(DynamicMap::Signed().codes()[i], q1[i].item<float>()) << i;
    EXPECT_EQ(DynamicMap::Unsigned().codes()[i], q2[i].item<float>()) << i;
  }
  // 1 maps to the code 1, -1 to the signed map's lowest (-0.993); 0 to the
  // code nearest its cell's centre (1.5e-5), not to 0: the cells are 2/65535
  // wide, so the smallest codes are never picked (bitsandbytes' table).
  EXPECT_EQ(DynamicMap::Signed().codes()[DynamicMap::Signed().Index(1.0f)], 1.0f);
  EXPECT_EQ(DynamicMap::Signed().Index(-1.0f), 0);
  EXPECT_NEAR(DynamicMap::Signed().codes()[DynamicMap::Signed().Index(0.0f)], 2.125e-05, 1e-10);
  EXPECT_EQ(DynamicMap::Unsigned().codes()[DynamicMap::Unsigned().Index(1.0f)], 1.0f);
}

AdamW8BitState::Allocate HostZeros() {
  return [](int64_t n, at::ScalarType t) { return at::zeros({n}, at::TensorOptions().dtype(t)); };
}

// Five steps (two clipped) of a, b and c in one process: the moments
// bitwise (the parameters within an ulp a step, below) bitsandbytes' CPU AdamW8bit (the same ops on the same
// tensors; the quantizer is its cell table's).
TEST(AdamW8Bit, OneProcessEqualsBitsandbytesBitwise) {
  const RecordedFile file("adamw_8bit.safetensors");
  auto read = [&](const std::string& name) { return file.Floats(name); };
  const ShardLayout layout = Layout(1);
  AdamW8BitState state(layout, 0, layout.padded_numel, HostZeros());
  at::Tensor p = read("p0");
  for (int64_t step = 1; step <= 5; ++step) {
    const std::string k = std::to_string(step);
    state.Update(RecordedAdamWStep(step), p, read("g" + k), read("clip" + k).reshape({}));
    // The moments are bitwise on every machine. The parameters' last
    // expression (decay, then the step over sqrt(v) + eps) runs through
    // torch's vectorized CPU kernels, whose pick depends on the ISA (the
    // recording's machine had AVX-512; an AVX2 machine rounds one of its
    // fp32 ops to the other neighbour): at most one ulp of |p| a step, so
    // `step` ulps after `step` steps.
    const at::Tensor want = read("p" + k);
    const float ulp = std::nextafter(want.abs().max().item<float>(), 1e30f) - want.abs().max().item<float>();
    EXPECT_LE((p - want).abs().max().item<float>(), static_cast<float>(step) * ulp) << "params after step " << step;
    EXPECT_TRUE(at::equal(state.exp_avg(), read("m" + k))) << "exp_avg after step " << step;
    EXPECT_TRUE(at::equal(state.exp_avg_sq(), read("v" + k))) << "exp_avg_sq after step " << step;
  }
}

// Three shards of a, b and c against one process, five recorded steps:
// every op is elementwise or a block's max, so an element whose block no
// shard edge cuts (and every fp32-moment element) ends bitwise as in one
// process; a cut block quantizes each part with its own absmax, which after
// the first step (the moments then (1 - b1) g and (1 - b2) g^2, the same
// values on both sides) leaves the two within two quantization steps.
TEST(AdamW8Bit, ShardsEqualOneProcessExceptInTheBlocksTheirEdgesCut) {
  const RecordedFile file("adamw_8bit.safetensors");
  auto read = [&](const std::string& name) { return file.Floats(name); };
  const ShardLayout one = Layout(1), three = Layout(3);
  const int64_t total = one.numel;
  for (const int64_t steps : {int64_t{1}, int64_t{5}}) {
    AdamW8BitState whole(one, 0, one.padded_numel, HostZeros());
    at::Tensor p = read("p0");
    for (int64_t s = 1; s <= steps; ++s) {
      whole.Update(RecordedAdamWStep(s), p, read("g" + std::to_string(s)), read("clip" + std::to_string(s)).reshape({}));
    }
    const at::Tensor m_one = whole.exp_avg();
    int64_t cut_blocks = 0;
    for (int r = 0; r < 3; ++r) {
      const int64_t first = three.ShardOffset(r), n = three.shard_numel;
      const int64_t real = std::max<int64_t>(0, std::min(n, total - first));
      AdamW8BitState part(three, first, n, HostZeros());
      at::Tensor shard = at::zeros({n});
      shard.narrow(0, 0, real).copy_(read("p0").narrow(0, first, real));
      for (int64_t s = 1; s <= steps; ++s) {
        at::Tensor g = at::zeros({n});
        g.narrow(0, 0, real).copy_(read("g" + std::to_string(s)).narrow(0, first, real));
        part.Update(RecordedAdamWStep(s), shard, g, read("clip" + std::to_string(s)).reshape({}));
      }
      const at::Tensor m = part.exp_avg();
      for (const MomentSegment& seg : part.blocks().segments) {
        // The tensor's length: its slot in the layout.
        int64_t numel = 0;
        for (const ParamSlot& slot : three.params) {
          if (first + seg.begin >= slot.offset && first + seg.begin < slot.offset + slot.spec.numel()) {
            numel = slot.spec.numel();
          }
        }
        auto same = [&](int64_t lo, int64_t hi) {
          EXPECT_TRUE(at::equal(shard.narrow(0, lo, hi - lo), p.narrow(0, first + lo, hi - lo)))
              << "rank " << r << " [" << lo << ", " << hi << ") after " << steps << " steps";
          EXPECT_TRUE(at::equal(m.narrow(0, lo, hi - lo), m_one.narrow(0, first + lo, hi - lo)));
        };
        if (!seg.quantized) {
          same(seg.begin, seg.end);
          continue;
        }
        for (int64_t b = seg.first_block; b < seg.first_block + seg.blocks; ++b) {
          int64_t lo = 0, hi = 0;
          MomentBlocks::BlockBounds(seg, b, &lo, &hi);
          const int64_t t0 = seg.tensor_first + (lo - seg.begin);
          if (t0 % MomentBlocks::kBlockNumel == 0 && (hi - lo == MomentBlocks::kBlockNumel || t0 + hi - lo == numel)) {
            same(lo, hi);
          } else if (steps == 1) {
            ++cut_blocks;
            // Each side is within half the widest gap of the signed map
            // plus a cell of the value, times its own absmax, which the
            // whole block's bounds: twice that apart at most.
            const int64_t w0 = first + lo - t0 % MomentBlocks::kBlockNumel;
            const at::Tensor block = m_one.narrow(0, w0, std::min<int64_t>(MomentBlocks::kBlockNumel, total - w0));
            float gap = 0;
            for (int i = 1; i < 256; ++i) {
              gap = std::max(gap, DynamicMap::Signed().codes()[i] - DynamicMap::Signed().codes()[i - 1]);
            }
            const float bound = 2 * (gap / 2 + 2.0f / 65535) * block.abs().max().item<float>() / 0.99f;
            EXPECT_LE((m.narrow(0, lo, hi - lo) - m_one.narrow(0, first + lo, hi - lo)).abs().max().item<float>(),
                      bound)
                << "rank " << r << " cut block at " << lo;
          }
        }
      }
    }
    if (steps == 1) EXPECT_GT(cut_blocks, 0);  // (the test's premise: the shard edges cut blocks)
  }
}

// A checkpoint holds the moments' values; a resume quantizes them again,
// into its own blocks. Each value comes back within half the widest gap
// between two codes plus a cell's width (2/65535), times its block's absmax:
// a block whose largest value was negative had it at -0.993 of its old
// absmax, so its new absmax is that and every value is picked anew, which
// can move it by no more than that.
TEST(AdamW8Bit, LoadedValuesComeBackWithinAQuantizationStep) {
  const RecordedFile file("adamw_8bit.safetensors");
  auto read = [&](const std::string& name) { return file.Floats(name); };
  const ShardLayout three = Layout(3);
  const at::Tensor p = read("p0");
  for (const DynamicMap* map : {&DynamicMap::Signed(), &DynamicMap::Unsigned()}) {
    float gap = 0;
    for (int i = 1; i < 256; ++i) gap = std::max(gap, map->codes()[i] - map->codes()[i - 1]);
    const double step = gap / 2 + 2.0 / 65535;
    for (int r = 0; r < 3; ++r) {
      const int64_t first = three.ShardOffset(r), n = three.shard_numel;
      AdamW8BitState state(three, first, n, HostZeros());
      at::Tensor shard = at::zeros({n});
      const int64_t real = std::max<int64_t>(0, std::min(n, three.numel - first));
      shard.narrow(0, 0, real).copy_(p.narrow(0, first, real));
      for (int64_t s = 1; s <= 3; ++s) {
        at::Tensor g = at::zeros({n});
        g.narrow(0, 0, real).copy_(read("g" + std::to_string(s)).narrow(0, first, real));
        state.Update(RecordedAdamWStep(s), shard, g, at::scalar_tensor(1.0f));
      }
      const bool is_m = map == &DynamicMap::Signed();
      const at::Tensor want = is_m ? state.exp_avg() : state.exp_avg_sq();
      ASSERT_GT(want.abs().sum().item<float>(), 0.0f);
      AdamW8BitState loaded(three, first, n, HostZeros());
      loaded.Load(state.exp_avg(), state.exp_avg_sq());
      const at::Tensor got = is_m ? loaded.exp_avg() : loaded.exp_avg_sq();
      for (const MomentSegment& seg : state.blocks().segments) {
        if (!seg.quantized) {
          EXPECT_TRUE(at::equal(got.narrow(0, seg.begin, seg.end - seg.begin),
                                want.narrow(0, seg.begin, seg.end - seg.begin)));
          continue;
        }
        for (int64_t b = seg.first_block; b < seg.first_block + seg.blocks; ++b) {
          int64_t lo = 0, hi = 0;
          MomentBlocks::BlockBounds(seg, b, &lo, &hi);
          const at::Tensor w = want.narrow(0, lo, hi - lo), d = (got.narrow(0, lo, hi - lo) - w).abs();
          const double bound = step * w.abs().max().item<float>() / 0.99;  // (the old absmax: >= max |w|)
          EXPECT_LE(d.max().item<float>(), bound) << "rank " << r << " block " << b << (is_m ? " m" : " v");
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardline
