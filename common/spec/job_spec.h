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

// ParseJobConfig, then [model] hf_dir resolved against `base_dir` and its
// config.json applied (ApplyHfConfig): what every program that runs or plans
// a job uses, so that all of them see the same model.
absl::StatusOr<JobConfig> ParseJobSpec(const std::string& toml_text, const std::string& source,
                                       const std::string& base_dir);

// Checks the values that only make sense together, for a world of `world_size`
// ranks (n_embd % n_head, batch divisibility, shard group size, ...).
absl::Status ValidateJobConfig(const JobConfig& c, int world_size, const std::string& source);

// The files the job reads exist: [data] path (unless synthetic), and the
// weights of [model] init_from or hf_dir hold every parameter of the model
// with its shape (headers only are read). Errors name the key and the file.
absl::Status CheckJobFiles(const JobConfig& c, const std::string& base_dir, const std::string& source);

}  // namespace shardline
