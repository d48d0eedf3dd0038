// TokenDataset: the training tokens of a job, memory-mapped, and the batch
// order of docs/design.md's numerics contract.
//
// Sources: llm.c `.bin` files (a 256 x int32 header: magic, version, token
// count; then the tokens: GPT-2's magic 20240520 version 1 with uint16
// tokens, or Llama 3's magic 20240801 version 7 with uint32 tokens, for
// vocabularies past 65,536), raw text read as bytes (vocab 256), and a
// synthetic generator (a function of the seed, nothing on disk).
//
// Several files (TokenSource: a list, globs expanded in sorted order) are one
// stream: their tokens back to back, in order.
//
// Order: with T = block_size, B = batch_size and n = floor((tokens - 1) / T)
// sequences, global step s uses sequences i = (s*B + j) mod n for j = 0..B-1;
// sequence i is tokens [i*T, i*T + T) as input and the next T as targets.
// It depends on the global step alone, so any world size reads one stream.
//
// Loss masks (supervised fine-tuning): one mask file per token file, a
// 256 x int32 header (magic 20240905, version 1, count equal to its token
// file's) then one byte per token, 1 where the token counts as a target and 0
// where it does not (a prompt). A target whose mask byte is 0 is given as
// kIgnoreTarget, which the cross-entropy skips; the loss is the mean over the
// counted targets of the global batch (CountedTargets).
//
// Packed documents: one document-starts file per token file, a 256 x int32
// header (magic 20241126, version 1, count equal to its token file's) then one
// byte per token, 1 where a document begins. Attention and positions then
// stay within a document (Batch's positions restart at 0 at each document's
// first token, and at each sequence's), and the target that would cross into
// the next document (its first token, predicted from the last of the one
// before) is kIgnoreTarget: a packed sequence computes what each of its
// documents computes alone, as TRL's packing with position ids does.
//
// Open() validates every file: a wrong magic or version, a truncated file, a
// token >= vocab_size, a mask or document-starts file of the wrong length or
// with a byte other than 0 or 1, or a stream shorter than one sequence is an
// error that names the file. The object is immutable and safe to share across
// threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "common/data/token_file_header.h"

namespace shardline {

// The magics and versions (kLlmcMagic, ...): common/data/token_file_header.h.
constexpr int64_t kIgnoreTarget = -100;  // torch's cross_entropy ignore_index

class TokenDataset {
 public:
  // The stream of `source`'s files (paths resolved; globs expanded here),
  // or the synthetic one.
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(DataFormat format, const TokenSource& source,
                                                            int vocab_size, int block_size, uint64_t seed);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return (num_tokens_ - 1) / block_size_; }

  bool masked() const { return masked_; }
  bool documents() const { return documents_; }

  // Inputs and targets [count, T] (int64) of sequences j in [j0, j0 + count)
  // of global step `step` with `batch_size` sequences per step; masked-out
  // targets, and those that cross into another document, are kIgnoreTarget.
  // `positions` (if given): each input's position in its document [count, T]
  // (int64) where the stream has document starts, else left undefined.
  void Batch(int64_t step, int batch_size, int j0, int count, at::Tensor* inputs, at::Tensor* targets,
             at::Tensor* positions = nullptr) const;
  // The targets of global step `step` that count: batch_size * T without
  // masks.
  int64_t CountedTargets(int64_t step, int batch_size) const;

 private:
  struct File;  // one mapped token file and its mask
  TokenDataset() = default;
  // Opens one llm.c token file and checks every token against the vocabulary.
  static absl::Status OpenLlmc(const std::string& path, int vocab_size, File* file);
  int64_t TokenAt(int64_t pos) const;
  bool Counts(int64_t pos) const;  // token pos counts as a target (its mask; no document starts there)
  bool DocumentStarts(int64_t pos) const;
  const File& FileAt(int64_t pos, int64_t* offset) const;
  // Sequence i of global step `step`.
  int64_t SequenceOf(int64_t step, int batch_size, int64_t j) const;

  DataFormat format_ = DataFormat::kSynthetic;
  int block_size_ = 0, vocab_size_ = 0;
  uint64_t seed_ = 0;
  int64_t num_tokens_ = 0;
  bool masked_ = false;
  bool documents_ = false;
  std::vector<std::unique_ptr<File>> files_;
  std::vector<int64_t> starts_;  // first stream position of each file
};

// Writes an llm.c .bin file (used by tests and the demo's data preparation):
// GPT-2's format for uint16 tokens, Llama 3's for uint32.
absl::Status WriteLlmcFile(const std::string& path, const std::vector<uint16_t>& tokens);
absl::Status WriteLlmcFile(const std::string& path, const std::vector<uint32_t>& tokens);
// Writes a loss mask file (one byte, 0 or 1, per token of its token file).
absl::Status WriteLossMaskFile(const std::string& path, const std::vector<uint8_t>& mask);

}  // namespace shardline
