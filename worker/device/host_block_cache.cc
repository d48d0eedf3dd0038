#include "worker/device/host_block_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace shardline {

void HostBlockCache::Unmap(const std::vector<Block>& blocks) {
  for (const Block& b : blocks) {
    munmap(b.data, b.bytes);
    mapped_bytes_.fetch_sub(static_cast<int64_t>(b.bytes), std::memory_order_relaxed);
  }
}

size_t HostBlockCache::ClassBytes(size_t bytes) {
  constexpr size_t kPage = 4096;
  const size_t pages = (bytes + kPage - 1) / kPage * kPage;
  const size_t step = std::max(kPage, (size_t{1} << (63 - __builtin_clzll(pages))) / 16);
  return (pages + step - 1) / step * step;
}

HostBlockCache::HostBlockCache(double slack) : slack_(std::max(0.0, slack)) {}

HostBlockCache::~HostBlockCache() { Trim(); }

int64_t HostBlockCache::Bound() const {
  return stats_.high_water_bytes + static_cast<int64_t>(slack_ * static_cast<double>(stats_.high_water_bytes));
}

HostBlockCache::Block HostBlockCache::Allocate(size_t bytes) {
  const size_t cls = ClassBytes(bytes);
  std::vector<Block> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it != free_.end()) {
      Block block = {it->second.back(), cls};
      it->second.pop_back();
      if (it->second.empty()) free_.erase(it);
      stats_.cached_bytes -= static_cast<int64_t>(block.bytes);
      stats_.live_bytes += static_cast<int64_t>(block.bytes);
      stats_.high_water_bytes = std::max(stats_.high_water_bytes, stats_.live_bytes);
      ++stats_.hits;
      return block;
    }
    ++stats_.misses;
    stats_.live_bytes += static_cast<int64_t>(cls);
    stats_.high_water_bytes = std::max(stats_.high_water_bytes, stats_.live_bytes);
    EvictLocked(&evicted);
  }
  Unmap(evicted);
  void* data = mmap(nullptr, cls, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.live_bytes -= static_cast<int64_t>(cls);
    return Block{};
  }
  mapped_bytes_.fetch_add(static_cast<int64_t>(cls), std::memory_order_relaxed);
  return Block{data, cls};
}

void HostBlockCache::Release(Block block) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.live_bytes -= static_cast<int64_t>(block.bytes);
  stats_.cached_bytes += static_cast<int64_t>(block.bytes);
  free_[block.bytes].push_back(block.data);
}

void HostBlockCache::EvictLocked(std::vector<Block>* out) {
  while (!free_.empty() && stats_.live_bytes + stats_.cached_bytes > Bound()) {
    auto it = std::prev(free_.end());
    out->push_back(Block{it->second.back(), it->first});
    it->second.pop_back();
    stats_.cached_bytes -= static_cast<int64_t>(it->first);
    ++stats_.unmapped_blocks;
    if (it->second.empty()) free_.erase(it);
  }
}

void HostBlockCache::Trim() {
  std::vector<Block> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.high_water_bytes = stats_.live_bytes;
    EvictLocked(&evicted);
  }
  Unmap(evicted);
}

HostBlockCache::Stats HostBlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace shardline
