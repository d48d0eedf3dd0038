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

// Whether all-gathering `rows_numel` elements from each of `replicas` ranks
// receives fewer elements than a ring all-reduce of `shard_numel` across
// them sends: rows against 2 (R-1)/R shard. The sparse embedding
// gathers its rows' gradients across replicas where it does (the engine's
// SparseEmbedding and the planner decide by this one test).
inline bool RowsGatherBeatsAllReduce(int64_t rows_numel, int64_t shard_numel, int replicas) {
  return int64_t{replicas} * rows_numel < 2 * shard_numel;
}

// Whether the vocabulary-parallel head (worker/engine/vocab_parallel_head.h)
// moves fewer bytes per micro-batch than gathering a tied table for the head:
// every rank's hidden states all-gathered (param bytes) and their gradients
// reduce-scattered (reduce bytes), `group_tokens` x `width` elements each,
// against the table's `table_numel` gathered and, where it trains
// (`table_reduce_bytes` > 0; 0: frozen), reduce-scattered. Both are ring
// collectives over one group, so the (G-1)/G factors cancel. The engine and
// the planner decide by this one test.
inline bool VocabParallelBeatsGather(int64_t group_tokens, int64_t width, int64_t table_numel, int param_bytes,
                                     int reduce_bytes, int table_reduce_bytes) {
  return group_tokens * width * (param_bytes + reduce_bytes) < table_numel * (param_bytes + table_reduce_bytes);
}

// Whether the tied head over the world (vocab_parallel_head.h: each rank
// computes over its replica's part of its shard for every rank's tokens)
// sends fewer bytes across `replicas` replicas per step than the head over
// the shard group: a rank's tokens' hidden states (param bytes) and their
// gradients (reduce bytes) cross to R-1 replicas, `step_tokens` x `width`
// elements each over the step's micro-batches, and the table's parts are
// exchanged once, an all-gather of (R-1)/R of `shard_numel` in reduce bytes,
// instead of the shard's all-reduce, twice that. Both sides' cancel.
// (The rows' gradients must cross the replicas already: the engine and the
// planner ask only where they do, RowsGatherBeatsAllReduce.)
inline bool HeadOverWorldBeatsAllReduce(int64_t step_tokens, int64_t width, int64_t shard_numel, int param_bytes,
                                        int reduce_bytes, int replicas) {
  return int64_t{replicas} * step_tokens * width * (param_bytes + reduce_bytes) < shard_numel * reduce_bytes;
}

}  // namespace shardline::comm
