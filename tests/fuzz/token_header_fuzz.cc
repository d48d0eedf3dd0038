// Fuzzes the llm.c token file and loss-mask headers (ParseLlmcHeader,
// ParseLossMaskHeader: the input is a whole file). Invariants: an error is one
// line naming the file; a header that parses promises no more entries than
// the file holds, of the width its magic names.
#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "tests/fuzz/fuzz_check.h"
#include "common/data/token_file_header.h"

namespace {

void Check(const absl::StatusOr<shardline::TokenFileHeader>& h, const std::string& path, int64_t file_bytes,
           bool mask) {
  if (!h.ok()) {
    FUZZ_CHECK(shardline::fuzz::NamesFileInOneLine(h.status().message(), path), "error \"%s\"",
               std::string(h.status().message()).c_str());
    return;
  }
  FUZZ_CHECK(mask ? h->width == 1 : (h->width == 2 || h->width == 4), "width %d", h->width);
  FUZZ_CHECK(h->count >= 0 && shardline::kTokenFileHeaderBytes + h->count * h->width <= file_bytes,
             "%lld entries of %d bytes in a file of %lld", static_cast<long long>(h->count), h->width,
             static_cast<long long>(file_bytes));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardline;
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  const absl::string_view head = file.substr(0, kTokenFileHeaderBytes);
  const int64_t file_bytes = static_cast<int64_t>(size);
  Check(ParseLlmcHeader(head, file_bytes, "train_000.bin"), "train_000.bin", file_bytes, false);
  Check(ParseLossMaskHeader(head, file_bytes, "train_000.mask"), "train_000.mask", file_bytes, true);
  return 0;
}
