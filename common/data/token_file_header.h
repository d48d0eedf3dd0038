// The header of an llm.c token file and of a loss-mask file, checked from the
// file's first bytes and its size alone (no LibTorch, no file access: what
// TokenDataset::Open uses for every file, and what the fuzz target drives).
//
// Format: 256 little-endian int32 (1024 bytes): magic, version, count, then
// unused; after it, count entries of the magic's width. GPT-2's magic
// 20240520 version 1 holds uint16 tokens, Llama 3's 20240801 version 7
// uint32 tokens, and a loss mask's 20240905 version 1 one byte per token.
//
// Errors: InvalidArgument naming the file (`path`): a file shorter than the
// header, a magic the kind of file does not use ("bad magic"), a version
// other than its magic's, a negative count, or a file too short for count
// entries ("truncated"). Pure functions: safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline {

constexpr int32_t kLlmcMagic = 20240520;  // uint16 tokens
constexpr int32_t kLlmcVersion = 1;
constexpr int32_t kLlmcLlama3Magic = 20240801;  // uint32 tokens
constexpr int32_t kLlmcLlama3Version = 7;
constexpr int32_t kLossMaskMagic = 20240905;  // uint8 mask bytes
constexpr int32_t kLossMaskVersion = 1;
constexpr int32_t kDocStartsMagic = 20241126;  // uint8: 1 where a document starts (packed sequences)
constexpr int32_t kDocStartsVersion = 1;
constexpr int64_t kTokenFileHeaderBytes = 256 * sizeof(int32_t);

struct TokenFileHeader {
  int width = 0;      // bytes per entry: 2 or 4 for tokens, 1 for mask bytes
  int64_t count = 0;  // entries after the header; the file holds at least
                      // kTokenFileHeaderBytes + count * width bytes
};

// `head`: the file's first bytes (the first kTokenFileHeaderBytes of them,
// or all of a shorter file); `file_bytes`: the file's size.
absl::StatusOr<TokenFileHeader> ParseLlmcHeader(absl::string_view head, int64_t file_bytes, const std::string& path);
absl::StatusOr<TokenFileHeader> ParseLossMaskHeader(absl::string_view head, int64_t file_bytes,
                                                    const std::string& path);
absl::StatusOr<TokenFileHeader> ParseDocStartsHeader(absl::string_view head, int64_t file_bytes,
                                                     const std::string& path);

}  // namespace shardline
