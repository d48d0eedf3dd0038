// Job files shared by the unit tests and the fuzz corpus (tests/fuzz/
// make_corpus.cc writes this one as its seed hybrid.toml): one copy, so that
// a key renamed in the parser is renamed in both.
#pragma once

namespace shardline::test {

// A valid two-worker hybrid_shard job on synthetic data, with keys from most
// sections set away from their defaults.
inline constexpr char kHybridJob[] = R"([job]
name = "gpt"
workers = 2
[model]
n_layer = 2
n_head = 4
n_embd = 32
vocab_size = 64
block_size = 16
[data]
format = "synthetic"
[train]
steps = 5
batch_size = 8
micro_batch_size = 2
[parallelism]
strategy = "hybrid_shard"
shard_group_size = 2
[precision]
param_dtype = "bf16"
[prefetch]
backward = "post"
)";

}  // namespace shardline::test
