// TensorMemory: every CPU tensor byte LibTorch allocates in this process, now
// and at its peak, counted by wrapping LibTorch's CPU allocator. It measures
// what the engine's ledger cannot see: autograd's saved activations and every
// temporary of forward and backward.
//
// Install() is idempotent and thread-safe; tensors allocated before it keep
// their own deleters and are simply not counted.
#pragma once

#include <cstdint>

namespace shardline {

class TensorMemory {
 public:
  static void Install();
  static int64_t current();
  static int64_t peak();
  static void ResetPeak();  // peak := current
};

}  // namespace shardline
