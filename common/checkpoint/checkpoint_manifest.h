// The checkpoint manifest: what makes `<dir>/<job>/step-<8 digits>/` a
// committed checkpoint. It is written last, after every rank's shard file is
// on disk, by a temp file, fsync, rename and fsync of the directory; a
// directory without one is not a checkpoint.
//
// It records everything needed to resume at any world size and strategy: the
// model config, the ownership map the shards were cut with, the step, the
// data position and schedule state, the seed, and each rank's file with its
// size and SHA-256.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "common/model/shard_layout.h"

namespace shardline {

struct ManifestUnit {
  std::string unit;
  int64_t numel = 0, padded = 0, shard = 0;
  int group_size = 1;
};

struct ManifestRankFile {
  int rank = 0;
  std::string file;  // relative to the checkpoint directory
  int64_t size = 0;
  std::string sha256;
};

struct CheckpointManifest {
  int format_version = 1;
  std::string job;
  int64_t step = 0;            // steps completed; resume runs step `step` next
  int64_t total_steps = 0;     // the schedule's S
  int64_t data_step = 0;       // the global step whose batch comes next
  uint64_t seed = 0;           // the only RNG state (GPT-2 here has no dropout)
  ModelConfig model;
  std::string strategy;
  int world_size = 1, shard_group_size = 1;
  // Under LoRA the shards hold the adapters only (units "<unit>.lora"); the
  // frozen base is recorded by where its weights came from.
  LoraConfig lora;            // enabled: a LoRA checkpoint
  std::string base_weights;   // LoraBaseWeights of the job
  std::vector<ManifestUnit> units;
  std::vector<ManifestRankFile> ranks;
};

// Where a LoRA job's frozen base comes from: "hf_dir <path>", "init_from
// <path>" or "seed <seed>" (the engine's initialisation).
std::string LoraBaseWeights(const JobConfig& c);
// The inverse, for a LoRA checkpoint: its model with [model] hf_dir or
// init_from set to the recorded base (neither for a seed-initialised one).
ModelConfig LoraBaseModel(const CheckpointManifest& m);

std::string StepDirName(int64_t step);  // "step-00000010"
// The file rank `rank` of attempt `attempt` writes for a step:
// "rank-00003.safetensors" for a job's first attempt (and shardline-train,
// attempt 0), "rank-00003.a0002.safetensors" for its second. Attempts are
// fenced by name: a rank of an ended attempt that wakes up late (a frozen
// process, a healed partition) writes and renames only its own attempt's
// file, never one a later attempt committed.
std::string RankFileName(int rank, int attempt = 0);
// The one file rank `rank` of `attempt` writes for step `step` under a job's
// checkpoint root; the coordinator accepts no other in a report.
std::string RankFilePath(const std::string& checkpoint_root, int64_t step, int rank, int attempt = 0);

// Sets `f`'s size and sha256 from the rank file just written at `path`,
// opened without following a symlink: what goes into the manifest (which the
// job's owner can read) is the file written, never what a link planted under
// its name points to. Errors name `path`.
absl::Status DescribeWrittenRankFile(const std::string& path, ManifestRankFile* f);

// The manifest of job `job` after `step` completed steps, at `world_size`
// ranks (the ownership map is the job's trainable one at its shard group
// size); the rank files are added once every rank reported.
absl::StatusOr<CheckpointManifest> NewManifest(const std::string& job, const JobConfig& config, int world_size,
                                               int64_t step);

// Writes "<dir>/manifest.json" atomically (WriteFileAtomically), with no
// confinement: for tests that build a manifest where they like. Every
// program commits through WriteManifestConfined.
absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& m);
// The commit (the coordinator's, shardline-train's rank 0) of step m.step of the job whose checkpoint root is
// `checkpoint_root`: writes the manifest into "<checkpoint_root>/step-N" only
// if that is the job's own directory once `..` and symlinks are resolved.
// Neither the root nor the step directory may be a symlink, and the step
// directory's real path must be the root's real path + "/step-N"; both are
// opened with O_NOFOLLOW and the manifest is written through them
// (WriteFileAtomicallyAt), so a link swapped in after the check is not
// followed either. A refusal is PermissionDenied naming the path.
absl::Status WriteManifestConfined(const std::string& checkpoint_root, const CheckpointManifest& m);
// NotFound ("<dir>: no manifest.json: not a committed checkpoint") when absent;
// InvalidArgument for one larger than kMaxManifestBytes (never read: the
// coordinator reads what a user names); otherwise ParseManifest of its text.
// 16 MiB holds the files of some 80,000 ranks and the layouts of thousands
// of units.
constexpr int64_t kMaxManifestBytes = 16 << 20;
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir);
// Parses and checks the text of a manifest (`path` names it in errors). A
// format_version other than 1 is InvalidArgument; malformed JSON, a missing or
// mistyped field, a number out of range, a model the engine rejects, an
// ownership map that is not the model's at the recorded group size, or rank
// files that are out of range, repeated, missing for shard group 0 or not
// plain file names are DataLoss naming the field. Never throws or aborts; no
// file access; safe to call from any thread.
absl::StatusOr<CheckpointManifest> ParseManifest(const std::string& text, const std::string& path);
// An error naming the first field where the checkpoint and the job disagree:
// the model, and whether and how it trains adapters (rank, alpha, targets)
// on which base, and (CheckBaseDigest) whether that base still holds the
// weights the adapters were trained on.
absl::Status CheckSameTraining(const CheckpointManifest& m, const JobConfig& c, const std::string& dir);
// OK when `m` records no base digest (written before they were) or when the
// base weights `base` names have that digest now; FailedPrecondition naming
// `dir` and the base otherwise. Reads the base's headers and samples
// (WeightSource::Digest).
absl::Status CheckBaseDigest(const CheckpointManifest& m, const ModelConfig& base, const std::string& dir);

}  // namespace shardline
