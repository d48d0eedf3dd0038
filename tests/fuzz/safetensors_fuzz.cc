// Fuzzes the safetensors header parser (ParseSafetensorsHeader: the input is
// a whole file: 8-byte length, JSON header, data). Invariants: an error is
// one line naming the file; a parsed header's tensors lie inside the data
// section, hold shape x element size bytes, and do not overlap.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "common/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardline;
  const std::string path = "model.safetensors";
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  const int64_t file_bytes = static_cast<int64_t>(size);
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(file, file_bytes, path);
  if (!h.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(h.status().message(), path), "error \"%s\"",
               std::string(h.status().message()).c_str());
    return 0;
  }
  FUZZ_CHECK(h->data_start >= 8 && h->data_start <= file_bytes, "data_start %lld of %lld bytes",
             static_cast<long long>(h->data_start), static_cast<long long>(file_bytes));
  const int64_t data_bytes = file_bytes - h->data_start;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, e] : h->entries) {
    FUZZ_CHECK(name != "__metadata__", "metadata parsed as a tensor");
    FUZZ_CHECK(0 <= e.begin && e.begin <= e.end && e.end <= data_bytes, "tensor %s at [%lld, %lld) of %lld",
               name.c_str(), static_cast<long long>(e.begin), static_cast<long long>(e.end),
               static_cast<long long>(data_bytes));
    for (int64_t d : e.shape) FUZZ_CHECK(d >= 0, "tensor %s has dimension %lld", name.c_str(), static_cast<long long>(d));
    const int bytes = SafetensorsElementBytes(e.dtype);
    if (bytes != 0) {
      FUZZ_CHECK(e.numel() * bytes == e.end - e.begin, "tensor %s: %lld elements of %d bytes in %lld", name.c_str(),
                 static_cast<long long>(e.numel()), bytes, static_cast<long long>(e.end - e.begin));
    }
    if (e.end > e.begin) ranges.push_back({e.begin, e.end});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    FUZZ_CHECK(ranges[i - 1].second <= ranges[i].first, "tensors at [%lld, %lld) and [%lld, %lld) overlap",
               static_cast<long long>(ranges[i - 1].first), static_cast<long long>(ranges[i - 1].second),
               static_cast<long long>(ranges[i].first), static_cast<long long>(ranges[i].second));
  }
  return 0;
}
