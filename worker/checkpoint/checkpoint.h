// Sharded checkpoints of the engine's state (docs/design.md, "Checkpoints").
//
// Each rank writes `rank-<5 digits>.safetensors` holding, for every unit,
// its shard of the master parameters and of Adam's m and v ("<unit>.param",
// "<unit>.exp_avg", "<unit>.exp_avg_sq"), each in its [optimizer] dtype
// (F32 or BF16). Loading reads, for each unit, only
// the pieces of the old ranks' shards that overlap this rank's new shard, so
// a checkpoint resumes at any world size and any strategy and no process ever
// holds the whole model. Files are verified against the manifest's SHA-256
// before use; a mismatch is an error naming the file.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "worker/engine/engine.h"

namespace shardline {

// What one rank saves: its shard of every unit. `copy` clones the tensors
// (an async save writes the copy while training goes on); otherwise the
// snapshot views the engine's live state. Where the optimizer is sharded
// across the replicas the shard is gathered from them (Engine::WholeShard:
// every rank of the replicate group takes its snapshot at the same step).
struct ShardSnapshot {
  int rank = 0, shard_rank = 0;
  std::vector<std::string> units;
  std::vector<Engine::ShardState> shards;
  int64_t bytes() const;
};
absl::StatusOr<ShardSnapshot> SnapshotShards(Engine& engine, bool copy);


// Writes a snapshot as `step_dir`/RankFileName(rank, attempt) (created
// atomically) and returns its manifest entry (name, size, SHA-256).
absl::StatusOr<ManifestRankFile> WriteRankShards(const ShardSnapshot& snap, const std::string& step_dir, int64_t step,
                                                 int attempt = 0);
// WriteRankShards of the live state.
absl::StatusOr<ManifestRankFile> SaveRankShards(Engine& engine, const std::string& step_dir, int64_t step);

// The manifest for a checkpoint after `step` completed steps, without the
// rank files (the committer adds them once every rank reported).
absl::StatusOr<CheckpointManifest> ManifestFor(const Engine& engine, const JobConfig& config, int64_t step);

// Loads a committed checkpoint into `engine` (every rank calls it) and returns
// its manifest. Refuses a directory without a manifest, another model's
// checkpoint, and a file whose checksum does not match.
absl::StatusOr<CheckpointManifest> LoadCheckpoint(Engine& engine, const JobConfig& config,
                                                  const std::string& step_dir);

}  // namespace shardline
