#include "worker/device/tensor_memory.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include <c10/core/CPUAllocator.h>

#include "worker/device/host_block_cache.h"

namespace shardline {
namespace {

// Tensor bytes live (and their peak); bytes held from the system for them,
// malloc's plus the block cache's mappings (and their peak).
std::atomic<int64_t> g_current{0}, g_peak{0}, g_malloced{0}, g_reserved_peak{0};

void RaisePeak(std::atomic<int64_t>& peak, int64_t now) {
  int64_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

// A quarter of the high water: with it the bench's small GPT (16
// micro-batches, 2 steps) unmapped 5 blocks, against 572 with none
// (HostBlockCache's header says why any slack).
constexpr double kCacheSlack = 0.25;

HostBlockCache& LargeBlocks() {
  static HostBlockCache* cache = new HostBlockCache(kCacheSlack);  // never destroyed: tensors may outlive statics
  return *cache;
}

bool CacheLargeBlocks() {
  static const bool on = [] {
    const char* v = std::getenv("SHARDLINE_HOST_BLOCK_CACHE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

int64_t Reserved() { return g_malloced.load() + LargeBlocks().mapped_bytes(); }

// Allocates 64-byte-aligned blocks (as LibTorch's own CPU allocator does)
// with a 64-byte header just before the data (alignment stays 64): the
// tensor's size and where its block came from, large ones from the
// HostBlockCache and the rest from malloc. The DataPtr is a "simple" one
// (context == data, raw_deleter set), as LibTorch's kernels that use
// raw_allocate require.
constexpr size_t kHeader = 64;
struct BlockHeader {
  size_t bytes;        // the tensor's
  size_t block_bytes;  // the cache's mapping; 0 for malloc's
};
static_assert(sizeof(BlockHeader) <= kHeader);

// A tensor of `n` bytes takes its header and n, rounded up to the alignment.
size_t BlockBytes(size_t n) { return (n + kHeader + kHeader - 1) / kHeader * kHeader; }

class CountingAllocator final : public at::Allocator {
 public:
  at::DataPtr allocate(size_t n) override {
    const size_t total = BlockBytes(n);
    HostBlockCache::Block block;
    if (CacheLargeBlocks() && total >= HostBlockCache::kMinBytes) {
      block = LargeBlocks().Allocate(total);
    } else {
      block.data = std::aligned_alloc(kHeader, total);
      if (block.data) g_malloced.fetch_add(static_cast<int64_t>(total));
    }
    char* base = static_cast<char*>(block.data);
    if (!base) throw std::bad_alloc();
    new (base) BlockHeader{n, block.bytes};
    RaisePeak(g_peak, g_current.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n));
    RaisePeak(g_reserved_peak, Reserved());
    void* data = base + kHeader;
    return at::DataPtr(data, data, &Release, at::Device(at::kCPU));
  }
  at::DeleterFnPtr raw_deleter() const override { return &Release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  static void Release(void* data) {
    if (!data) return;
    char* base = static_cast<char*>(data) - kHeader;
    const BlockHeader h = *reinterpret_cast<const BlockHeader*>(base);
    g_current.fetch_sub(static_cast<int64_t>(h.bytes));
    if (h.block_bytes != 0) {
      LargeBlocks().Release(HostBlockCache::Block{base, h.block_bytes});
    } else {
      g_malloced.fetch_sub(static_cast<int64_t>(BlockBytes(h.bytes)));
      std::free(base);
    }
  }
};

}  // namespace

void TensorMemory::Install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting;
    c10::SetCPUAllocator(&counting, /*priority=*/1);
  });
}

int64_t TensorMemory::current() { return g_current.load(); }
int64_t TensorMemory::peak() { return g_peak.load(); }
int64_t TensorMemory::reserved() { return Reserved(); }
int64_t TensorMemory::peak_reserved() { return g_reserved_peak.load(); }

void TensorMemory::ResetPeak() {
  g_peak.store(g_current.load());
  g_reserved_peak.store(Reserved());
}

void TensorMemory::ReleaseCached() { LargeBlocks().Trim(); }

}  // namespace shardline
