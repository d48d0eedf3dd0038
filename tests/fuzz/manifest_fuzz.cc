// Fuzzes the checkpoint manifest parser (ParseManifest: JSON text, parsed and
// checked as ReadManifest does). Invariants: an error is one line naming the
// file; a manifest that parses is one a reader can rely on: its ownership map
// is the model's at the recorded shard group size, and shard group 0 has one
// plain file name per rank.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint/checkpoint_manifest.h"
#include "common/model/model_shapes.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardline;
  const std::string path = "ckpt/step-00000010/manifest.json";
  absl::StatusOr<CheckpointManifest> m =
      ParseManifest(std::string(reinterpret_cast<const char*>(data), size), path);
  if (!m.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(m.status().message(), path), "error \"%s\"",
               std::string(m.status().message()).c_str());
    return 0;
  }
  FUZZ_CHECK(m->format_version == 1, "format_version %d", m->format_version);
  FUZZ_CHECK(m->world_size >= 1 && m->shard_group_size >= 1 && m->world_size % m->shard_group_size == 0,
             "world %d, group %d", m->world_size, m->shard_group_size);
  FUZZ_CHECK(0 <= m->step && m->step <= m->total_steps, "step %lld of %lld", static_cast<long long>(m->step),
             static_cast<long long>(m->total_steps));
  const auto own = model::TrainableOwnershipMap(m->model, m->lora, m->shard_group_size);
  FUZZ_CHECK(own.ok() && own->size() == m->units.size(), "ownership map");
  std::vector<bool> seen(m->world_size, false);
  for (const ManifestRankFile& r : m->ranks) {
    FUZZ_CHECK(r.rank >= 0 && r.rank < m->world_size && !seen[r.rank], "rank %d", r.rank);
    seen[r.rank] = true;
    FUZZ_CHECK(!r.file.empty() && r.file != "." && r.file != ".." && r.file.find('/') == std::string::npos,
               "rank file \"%s\"", r.file.c_str());
  }
  for (int r = 0; r < m->shard_group_size; ++r) FUZZ_CHECK(seen[r], "no file for rank %d", r);
  // What resume derives from it.
  (void)LoraBaseModel(*m);
  return 0;
}
