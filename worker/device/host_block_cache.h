// HostBlockCache: the large host blocks CPU tensors live in, each its own
// mapping, kept after a tensor frees it for the next request of its size
// class (as CUDA's caching allocator keeps device blocks).
//
// Why: a rank's large tensors (unit buffers, gradients, activations, the
// reductions' scratch) come and go in the same pattern every micro-batch, in
// sizes that differ between forward, backward and the reductions. Served
// from glibc's heap they fragment it, and a rank's peak RSS grew with the
// micro-batch count though its live bytes did not (+23% at 16 micro-batches,
// bench/results/accumulation_memory.md); mapped afresh and returned each
// time (a fixed mmap threshold), every step faulted its buffers in again and
// ran a quarter slower. Here a freed block waits, already faulted in, for
// the same size class, which the next micro-batch asks for.
//
// Contract:
//  - A block is its request's class: the request rounded up to a page and
//    then to a sixteenth of its power of two (at most 1/16 over; near sizes
//    share a class). Only a cached block of the same class serves a request.
//  - Mapped bytes (live + cached) never exceed the high water, the most
//    bytes ever live at once through this cache (in class bytes), plus
//    `slack` times it: a miss that would pass that bound first unmaps cached
//    blocks, the largest first. The slack lets the phases of a micro-batch,
//    which need different classes at their peaks, keep theirs cached instead
//    of trading the same bytes back and forth (with none, the small GPT of
//    the bench remapped about 18 blocks per micro-batch).
//  - Trim() unmaps every cached block and lowers the high water to what is
//    live (after a one-off peak such as loading a checkpoint).
// Ownership: a block Allocate returns is the caller's until Release.
// Threads: every member is thread-safe (one mutex; mmap and munmap run
// outside it).
// Errors: Allocate returns a null block when the system refuses a mapping.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace shardline {

class HostBlockCache {
 public:
  // Requests below this go to malloc: a mapping per small tensor would cost
  // a syscall each, and small blocks do not strand a heap's pages.
  static constexpr size_t kMinBytes = size_t{256} << 10;

  struct Block {
    void* data = nullptr;  // page-aligned
    size_t bytes = 0;      // the mapping's, its class: at least the request
  };

  struct Stats {
    int64_t live_bytes = 0, cached_bytes = 0, high_water_bytes = 0;
    int64_t hits = 0, misses = 0, unmapped_blocks = 0;
  };

  // The class a request of `bytes` (>= kMinBytes) is served from.
  static size_t ClassBytes(size_t bytes);

  explicit HostBlockCache(double slack);
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;
  ~HostBlockCache();  // unmaps cached blocks; live ones are the callers'

  // A block of ClassBytes(bytes), or a null one if the system refused.
  Block Allocate(size_t bytes);
  // Gives back a block Allocate returned.
  void Release(Block block);
  void Trim();

  Stats stats() const;
  // Live + cached, without the lock (for a caller's peak of reserved bytes).
  int64_t mapped_bytes() const { return mapped_bytes_.load(std::memory_order_relaxed); }

 private:
  int64_t Bound() const;  // under mu_
  // Under mu_: moves cached blocks, largest first, to `out` until live +
  // cached is within Bound().
  void EvictLocked(std::vector<Block>* out);
  void Unmap(const std::vector<Block>& blocks);

  const double slack_;
  std::atomic<int64_t> mapped_bytes_{0};
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // class bytes -> cached blocks
  Stats stats_;
};

}  // namespace shardline
