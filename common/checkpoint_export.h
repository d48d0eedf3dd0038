// Reading a committed checkpoint by unit, and exporting it as one model file.
//
// CheckpointReader serves any element range of a unit's flat parameters or
// Adam moments, reading only the pieces of the ranks' shard files that
// overlap it; each file is verified against the manifest's SHA-256 the first
// time it is opened (a mismatch is an error naming the file).
//
// ExportModel writes the full model as one safetensors file with nanoGPT's
// names, both `transformer.wte.weight` and `lm_head.weight` (tied), built one
// unit at a time: no step holds more than one unit in memory.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/checkpoint_manifest.h"
#include "common/safetensors.h"

namespace shardline {

class CheckpointReader {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& step_dir);
  const CheckpointManifest& manifest() const { return manifest_; }
  // Elements [lo, hi) of unit `unit`'s flat `kind` ("param", "exp_avg" or
  // "exp_avg_sq") into dst; hi must not exceed the unit's numel.
  absl::Status Read(int unit, const std::string& kind, int64_t lo, int64_t hi, float* dst);

 private:
  absl::StatusOr<const SafetensorsReader*> RankFile(int rank);
  std::string dir_;
  CheckpointManifest manifest_;
  std::map<int, std::unique_ptr<SafetensorsReader>> files_;
};

absl::Status ExportModel(const std::string& step_dir, const std::string& out_path);

}  // namespace shardline
