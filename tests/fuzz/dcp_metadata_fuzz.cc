// Fuzzes the DCP .metadata reader (ParseDcpMetadata: PickleReader with DCP's
// allow-list). Invariants: nothing is run or imported whatever the bytes
// (the reader only builds values), an error is one line naming the file, and
// what parses is what a loader may rely on: chunks inside their tensors, and
// storage files that are plain names in the checkpoint directory.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/checkpoint/dcp_metadata.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardline;
  const std::string path = "ckpt/.metadata";
  absl::StatusOr<DcpMetadata> m = ParseDcpMetadata(std::string(reinterpret_cast<const char*>(data), size), path);
  if (!m.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(m.status().message(), path), "error \"%s\"",
               std::string(m.status().message()).c_str());
    return 0;
  }
  for (const auto& [fqn, t] : m->tensors) {
    for (const DcpChunk& c : t.chunks) {
      FUZZ_CHECK(c.offsets.size() == t.size.size() && c.sizes.size() == t.size.size(), "chunk rank");
      for (size_t d = 0; d < t.size.size(); ++d) {
        FUZZ_CHECK(c.offsets[d] >= 0 && c.sizes[d] >= 0 && c.offsets[d] + c.sizes[d] <= t.size[d],
                   "chunk outside %s", fqn.c_str());
      }
    }
  }
  for (const DcpStorage& s : m->storage) {
    FUZZ_CHECK(!s.relative_path.empty() && s.relative_path.find('/') == std::string::npos &&
                   s.relative_path != ".." && s.offset >= 0 && s.length >= 0,
               "storage %s", s.relative_path.c_str());
  }
  return 0;
}
