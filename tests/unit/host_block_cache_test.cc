// HostBlockCache: size classes, reuse, the high-water bound on what it maps,
// Trim, threads; and TensorMemory serving LibTorch's large CPU tensors from it.
#include "worker/device/host_block_cache.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "worker/device/tensor_memory.h"

namespace shardline {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(HostBlockCache, ClassesArePagesAtMostOneSixteenthOver) {
  size_t previous = 0;
  for (size_t bytes = HostBlockCache::kMinBytes; bytes < 300 * kMiB; bytes = bytes * 9 / 8 + 12345) {
    const size_t cls = HostBlockCache::ClassBytes(bytes);
    EXPECT_EQ(cls % 4096, 0u) << bytes;
    EXPECT_GE(cls, bytes);
    EXPECT_LE(cls, bytes + bytes / 16 + 4096) << bytes;
    EXPECT_GE(cls, previous) << "classes grow with the request";
    previous = cls;
  }
  // Near sizes share a class: a unit's buffer of 1,000,000 floats and one a
  // few elements longer are served by the same block.
  EXPECT_EQ(HostBlockCache::ClassBytes(4000000), HostBlockCache::ClassBytes(4000064));
  EXPECT_EQ(HostBlockCache::ClassBytes(3 * kMiB - 100), 3 * kMiB);
}

TEST(HostBlockCache, AFreedBlockServesTheNextRequestOfItsClass) {
  HostBlockCache cache(0);
  const HostBlockCache::Block a = cache.Allocate(3 * kMiB);
  ASSERT_NE(a.data, nullptr);
  EXPECT_EQ(a.bytes, HostBlockCache::ClassBytes(3 * kMiB));
  std::memset(a.data, 7, 3 * kMiB);
  cache.Release(a);
  EXPECT_EQ(cache.stats().cached_bytes, static_cast<int64_t>(a.bytes));
  const HostBlockCache::Block b = cache.Allocate(3 * kMiB - 100);  // the same class
  EXPECT_EQ(b.data, a.data);
  EXPECT_EQ(static_cast<unsigned char*>(b.data)[12345], 7) << "the block comes back as it was, already faulted in";
  const HostBlockCache::Stats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(cache.mapped_bytes(), static_cast<int64_t>(b.bytes));
  cache.Release(b);
}

// The property that keeps peak RSS flat: whatever the pattern of sizes, what
// the cache maps (live + cached) never passes the most it ever had live at
// once (what any allocator must map at that moment) by more than its slack.
void CheckBound(double slack) {
  HostBlockCache cache(slack);
  std::mt19937 rng(26);
  std::uniform_int_distribution<size_t> size(HostBlockCache::kMinBytes, 24 * kMiB);
  std::vector<HostBlockCache::Block> live;
  int64_t live_classes = 0, most_live = 0;
  for (int op = 0; op < 3000; ++op) {
    if (live.size() < 4 || (live.size() < 40 && rng() % 2 == 0)) {
      // A handful of sizes that recur (a step's buffers) and some that do not.
      const size_t bytes = rng() % 3 == 0 ? size(rng) : (1 + rng() % 6) * 2 * kMiB + 4096 * (rng() % 3);
      const HostBlockCache::Block b = cache.Allocate(bytes);
      ASSERT_NE(b.data, nullptr);
      ASSERT_EQ(b.bytes, HostBlockCache::ClassBytes(bytes));
      static_cast<char*>(b.data)[bytes - 1] = 1;
      live.push_back(b);
      live_classes += static_cast<int64_t>(b.bytes);
      most_live = std::max(most_live, live_classes);
    } else {
      const size_t i = rng() % live.size();
      cache.Release(live[i]);
      live_classes -= static_cast<int64_t>(live[i].bytes);
      live[i] = live.back();
      live.pop_back();
    }
    const HostBlockCache::Stats s = cache.stats();
    ASSERT_EQ(s.live_bytes, live_classes);
    ASSERT_EQ(s.high_water_bytes, most_live);
    // Each miss unmaps down to the bound and then maps its own block, which
    // the high water already counts.
    ASSERT_LE(s.live_bytes + s.cached_bytes, most_live + static_cast<int64_t>(slack * most_live)) << "at op " << op;
    ASSERT_EQ(cache.mapped_bytes(), s.live_bytes + s.cached_bytes);
  }
  const HostBlockCache::Stats s = cache.stats();
  EXPECT_GT(s.hits, s.misses / 2) << "recurring sizes are served from the cache";
  for (const HostBlockCache::Block& b : live) cache.Release(b);
}

TEST(HostBlockCache, MappedBytesNeverPassTheLiveHighWater) { CheckBound(0); }
TEST(HostBlockCache, MappedBytesNeverPassTheLiveHighWaterPlusSlack) { CheckBound(0.25); }

TEST(HostBlockCache, TrimUnmapsTheCacheAndLowersTheHighWater) {
  HostBlockCache cache(0);
  const HostBlockCache::Block big = cache.Allocate(64 * kMiB);
  const HostBlockCache::Block small = cache.Allocate(kMiB);
  cache.Release(big);
  cache.Trim();
  HostBlockCache::Stats s = cache.stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.live_bytes, static_cast<int64_t>(small.bytes));
  EXPECT_EQ(s.high_water_bytes, s.live_bytes);
  EXPECT_EQ(cache.mapped_bytes(), s.live_bytes);
  // Past the trim the old 64 MiB peak no longer lets a freed block stay
  // cached beyond what is live: a 2 MiB request unmaps the 1 MiB block.
  cache.Release(small);
  const HostBlockCache::Block again = cache.Allocate(2 * kMiB);
  s = cache.stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.unmapped_blocks, 2);
  cache.Release(again);
}

TEST(HostBlockCache, ThreadsShareIt) {
  HostBlockCache cache(0.25);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 500; ++i) {
        const size_t bytes = (1 + rng() % 4) * kMiB;
        const HostBlockCache::Block b = cache.Allocate(bytes);
        auto* p = static_cast<unsigned char*>(b.data);
        ASSERT_NE(p, nullptr);
        std::memset(p, t + 1, bytes);
        ASSERT_EQ(p[bytes / 2], t + 1) << "a block is one thread's while it is live";
        cache.Release(b);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const HostBlockCache::Stats s = cache.stats();
  EXPECT_EQ(s.live_bytes, 0);
  EXPECT_LE(s.cached_bytes, s.high_water_bytes + s.high_water_bytes / 4);
  EXPECT_EQ(s.hits + s.misses, 2000);
}

TEST(TensorMemory, LargeTensorsReuseTheirBlocks) {
  TensorMemory::Install();
  const int64_t before = TensorMemory::current();
  const void* first = nullptr;
  {
    at::Tensor t = at::ones({1 << 20}, at::kFloat);  // 4 MiB
    first = t.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    EXPECT_EQ(TensorMemory::current() - before, 4 << 20);
  }
  EXPECT_EQ(TensorMemory::current(), before);
  at::Tensor again = at::zeros({1 << 20}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), first) << "the freed 4 MiB block serves the next 4 MiB tensor";
  EXPECT_EQ(again.sum().item<float>(), 0.0f);
  EXPECT_GE(TensorMemory::reserved(), TensorMemory::current());
  at::Tensor small = at::ones({1000}, at::kFloat);  // from malloc
  EXPECT_EQ(small.sum().item<float>(), 1000.0f);
  const int64_t reserved = TensorMemory::reserved();
  again = at::Tensor();
  EXPECT_EQ(TensorMemory::reserved(), reserved) << "a freed large block stays cached";
  TensorMemory::ReleaseCached();
  EXPECT_LE(TensorMemory::reserved(), reserved - (4 << 20)) << "until the cache is released";
}

}  // namespace
}  // namespace shardline
