#include "worker/device/tensor_memory.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <mutex>

#include <c10/core/CPUAllocator.h>

namespace shardline {
namespace {

std::atomic<int64_t> g_current{0}, g_peak{0};

void Count(int64_t delta) {
  const int64_t now = g_current.fetch_add(delta) + delta;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// Allocates 64-byte-aligned blocks (as LibTorch's own CPU allocator does) with
// the block's size in a
// 64-byte header just before the data (alignment stays 64). The DataPtr is a
// "simple" one (context == data, raw_deleter set), as LibTorch's kernels
// that use raw_allocate require.
constexpr size_t kHeader = 64;

class CountingAllocator final : public at::Allocator {
 public:
  at::DataPtr allocate(size_t n) override {
    const size_t total = (n + kHeader + kHeader - 1) / kHeader * kHeader;
    char* base = static_cast<char*>(std::aligned_alloc(kHeader, total));
    if (!base) throw std::bad_alloc();
    *reinterpret_cast<size_t*>(base) = n;
    Count(static_cast<int64_t>(n));
    void* data = base + kHeader;
    return at::DataPtr(data, data, &Release, at::Device(at::kCPU));
  }
  at::DeleterFnPtr raw_deleter() const override { return &Release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  static void Release(void* data) {
    if (!data) return;
    char* base = static_cast<char*>(data) - kHeader;
    Count(-static_cast<int64_t>(*reinterpret_cast<size_t*>(base)));
    std::free(base);
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
void TensorMemory::ResetPeak() { g_peak.store(g_current.load()); }

}  // namespace shardline
