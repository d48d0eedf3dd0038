// TensorMemory: LibTorch's CPU allocator for this process. It counts every
// CPU tensor byte LibTorch allocates, now and at its peak (what the engine's
// ledger cannot see: autograd's saved activations and every temporary of
// forward and backward), and serves large tensors from a HostBlockCache so
// that a rank's RSS stays at its peak of live bytes however many
// micro-batches a step runs (host_block_cache.h says why and how).
//
//   allocated  bytes of live tensors
//   reserved   bytes held from the system for them: malloc's small blocks
//              and the cache's mappings, live and cached
//
// SHARDLINE_HOST_BLOCK_CACHE=0 in the environment serves every tensor from
// malloc, as LibTorch's own allocator does (for comparison:
// bench/accumulation_memory.py).
//
// Install() is idempotent and thread-safe; tensors allocated before it keep
// their own deleters and are simply not counted. Every member is
// thread-safe.
#pragma once

#include <cstdint>

namespace shardline {

class TensorMemory {
 public:
  static void Install();
  static int64_t current();
  static int64_t peak();
  static int64_t reserved();
  static int64_t peak_reserved();
  static void ResetPeak();  // peaks := now
  // Returns the cache's blocks to the system (after a one-off peak).
  static void ReleaseCached();
};

}  // namespace shardline
