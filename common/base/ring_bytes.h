// The bytes a ring collective sends per rank, which is what every backend
// does: all-gather and reduce-scatter move (n-1)/n of the full buffer,
// all-reduce twice that (of the buffer padded to a multiple of n elements).
// The communicators count by these, tests compare measured counters with
// them, and `shardctl plan` predicts with them. Pure arithmetic.
#pragma once

#include <cstdint>

namespace shardline::comm {

inline int64_t RingAllGatherBytes(int64_t full_bytes, int n) { return full_bytes / n * (n - 1); }
inline int64_t RingReduceScatterBytes(int64_t full_bytes, int n) { return full_bytes / n * (n - 1); }
inline int64_t RingAllReduceBytes(int64_t bytes, int elem_size, int n) {
  const int64_t elems = bytes / elem_size;
  const int64_t padded = (elems + n - 1) / n * n * elem_size;
  return 2 * (padded / n * (n - 1));
}

}  // namespace shardline::comm
