// The job spec: a job file resolved against what it names and validated.
// This is the layer above the job file's types (common/job) and the model's
// files (common/model): applying [model] hf_dir's config.json and an
// adapter's adapter_config.json, and checking the data and weight files,
// need both.
//
// Contract: nothing here throws; every error is one line naming the job file
// (`source`), the key and, where one is at fault, the file.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job/job_config.h"

namespace shardline {

// The one resolver of a job file, what every program that runs or plans a
// job uses, so that all of them see the same job: ParseJobConfig; then every
// path the file names ([model] init_from and hf_dir, [lora] init_from, each
// [data] path and pattern) made absolute against `base_dir`, the job file's
// folder (the working directory where empty), here and nowhere else; then
// [model] hf_dir's config.json (ApplyHfConfig) and [lora] init_from's
// adapter_config.json (ApplyPeftConfig) applied; then the training stream's
// length from its files' headers (TrainConfig.sequences_per_epoch; left 0
// where they do not read yet, for CheckJobFiles to name) and [train] epochs
// turned into steps. [checkpoint] dir is left as written: the coordinator
// places it (coordinator_jobs.cc).
absl::StatusOr<JobConfig> ResolveJobSpec(const std::string& toml_text, const std::string& source,
                                         const std::string& base_dir);

// ResolveJobSpec of the job file at `path`, its relative paths resolved
// against the file's folder (as `shardctl submit` sends it).
absl::StatusOr<JobConfig> ResolveJobFile(const std::string& path);

// Checks the values that only make sense together, for a world of `world_size`
// ranks (n_embd % n_head, batch divisibility, shard group size, ...).
absl::Status ValidateJobConfig(const JobConfig& c, int world_size, const std::string& source);

// The files the job reads exist: [data] path (unless synthetic), and the
// weights of [model] init_from or hf_dir hold every parameter of the model
// with its shape (headers only are read). Errors name the key and the file.
// `c` comes from ResolveJobSpec (its paths are absolute).
absl::Status CheckJobFiles(const JobConfig& c, const std::string& source);

}  // namespace shardline
