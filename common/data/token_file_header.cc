#include "common/data/token_file_header.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"

namespace shardline {
namespace {

struct HeaderKind {
  int32_t magic, version;
  int width;
};

// The count of an llm.c-style header: magic and version among `accepted`,
// and a file long enough for count entries of its width. `what` names the
// kind of file in errors ("llm.c", "loss mask").
absl::StatusOr<TokenFileHeader> ParseHeader(absl::string_view head, int64_t file_bytes, const std::string& path,
                                            std::initializer_list<HeaderKind> accepted, absl::string_view what) {
  const int64_t have = std::min<int64_t>(static_cast<int64_t>(head.size()), file_bytes);
  if (have < kTokenFileHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated ", what, " header (", std::max<int64_t>(have, 0),
                                                   " bytes, need ", kTokenFileHeaderBytes, ")"));
  }
  int32_t h[3];  // magic, version, count (little-endian, as every platform we run on)
  std::memcpy(h, head.data(), sizeof(h));
  for (const HeaderKind& k : accepted) {
    if (h[0] != k.magic) continue;
    if (h[1] != k.version) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported ", what, " version ", h[1], " (expected ",
                                                     k.version, " for magic ", h[0], ")"));
    }
    const int64_t count = h[2];
    const int64_t need = kTokenFileHeaderBytes + std::max<int64_t>(count, 0) * k.width;  // < 2^34: no overflow
    if (count < 0 || file_bytes < need) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: header promises ", count, " entries (", need,
                                                     " bytes), file has ", file_bytes));
    }
    return TokenFileHeader{k.width, count};
  }
  std::string expected;
  for (const HeaderKind& k : accepted) absl::StrAppend(&expected, expected.empty() ? "" : " or ", k.magic);
  return absl::InvalidArgumentError(absl::StrCat(path, ": bad magic ", h[0], " (expected ", expected, "; not ",
                                                 what == "llm.c" ? "an llm.c token" : "a loss mask", " file)"));
}

}  // namespace

absl::StatusOr<TokenFileHeader> ParseLlmcHeader(absl::string_view head, int64_t file_bytes, const std::string& path) {
  return ParseHeader(head, file_bytes, path,
                     {{kLlmcMagic, kLlmcVersion, 2}, {kLlmcLlama3Magic, kLlmcLlama3Version, 4}}, "llm.c");
}

absl::StatusOr<TokenFileHeader> ParseLossMaskHeader(absl::string_view head, int64_t file_bytes,
                                                    const std::string& path) {
  return ParseHeader(head, file_bytes, path, {{kLossMaskMagic, kLossMaskVersion, 1}}, "loss mask");
}

absl::StatusOr<TokenFileHeader> ParseDocStartsHeader(absl::string_view head, int64_t file_bytes,
                                                     const std::string& path) {
  return ParseHeader(head, file_bytes, path, {{kDocStartsMagic, kDocStartsVersion, 1}}, "document starts");
}

}  // namespace shardline
