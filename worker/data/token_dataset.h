// TokenDataset: the training tokens of a job, memory-mapped, and the batch
// order of DESIGN.md's numerics contract.
//
// Sources: llm.c `.bin` files (a 256 x int32 header: magic, version, token
// count; then the tokens: GPT-2's magic 20240520 version 1 with uint16
// tokens, or Llama 3's magic 20240801 version 7 with uint32 tokens, for
// vocabularies past 65,536), raw text read as bytes (vocab 256), and a
// synthetic generator (a function of the seed, nothing on disk).
//
// Order: with T = block_size, B = batch_size and n = floor((tokens - 1) / T)
// sequences, global step s uses sequences i = (s*B + j) mod n for j = 0..B-1;
// sequence i is tokens [i*T, i*T + T) as input and the next T as targets.
// It depends on the global step alone, so any world size reads one stream.
//
// Open() validates the whole file: a wrong magic or version, a truncated file,
// a token >= vocab_size, or a file shorter than one sequence is an error that
// names the file. The object is immutable and safe to share across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "common/job_config.h"

namespace shardline {

constexpr int32_t kLlmcMagic = 20240520;  // uint16 tokens
constexpr int32_t kLlmcVersion = 1;
constexpr int32_t kLlmcLlama3Magic = 20240801;  // uint32 tokens
constexpr int32_t kLlmcLlama3Version = 7;

class TokenDataset {
 public:
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(const DataConfig& data, int vocab_size,
                                                            int block_size, uint64_t seed);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return (num_tokens_ - 1) / block_size_; }

  // Inputs and targets [count, T] (int64) of sequences j in [j0, j0 + count)
  // of global step `step` with `batch_size` sequences per step.
  void Batch(int64_t step, int batch_size, int j0, int count, at::Tensor* inputs,
             at::Tensor* targets) const;

 private:
  TokenDataset() = default;
  int64_t TokenAt(int64_t pos) const;
  // Validates the mapped llm.c file (header, length, every token < vocab).
  absl::Status ParseLlmc(const std::string& path);

  DataFormat format_ = DataFormat::kSynthetic;
  int block_size_ = 0, vocab_size_ = 0;
  uint64_t seed_ = 0;
  int64_t num_tokens_ = 0;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* u16_ = nullptr;  // llmc GPT-2 tokens
  const uint32_t* u32_ = nullptr;  // llmc Llama 3 tokens
  const uint8_t* u8_ = nullptr;    // text bytes
};

// Writes an llm.c .bin file (used by tests and the demo's data preparation):
// GPT-2's format for uint16 tokens, Llama 3's for uint32.
absl::Status WriteLlmcFile(const std::string& path, const std::vector<uint16_t>& tokens);
absl::Status WriteLlmcFile(const std::string& path, const std::vector<uint32_t>& tokens);

}  // namespace shardline
