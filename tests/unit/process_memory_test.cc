// ProcessRssBytes and ProcessPeakRssBytes against memory this test touches.
#include "common/base/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace shardline {
namespace {

TEST(ProcessMemory, PeakHoldsWhatWasTouchedAfterItIsFreed) {
  constexpr size_t kBytes = size_t{64} << 20;
  const int64_t before = ProcessPeakRssBytes();
  {
    std::unique_ptr<char[]> block(new char[kBytes]);
    std::memset(block.get(), 1, kBytes);  // resident only once written
    volatile char last = block[kBytes - 1];  // read, so that the writes are not elided
    EXPECT_EQ(last, 1);
    EXPECT_GE(ProcessRssBytes(), static_cast<int64_t>(kBytes));
  }
  const int64_t peak = ProcessPeakRssBytes();
  EXPECT_GE(peak, static_cast<int64_t>(kBytes));
  EXPECT_GE(peak, before);
  EXPECT_GE(peak, ProcessRssBytes());
}

}  // namespace
}  // namespace shardline
