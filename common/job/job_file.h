// The job file (TOML) of docs/design.md, read into a JobConfig, and the paths it
// names as the programs see them.
//
// Contract: ParseJobConfig never throws. Every error is one line naming the
// file and the key at fault ("job.toml: [train] steps = 0 is out of range
// [1, 2147483647]"). Unknown sections or keys are errors, so a typo never
// silently falls back to a default. Values that only make sense together are
// checked by ValidateJobConfig (common/spec/job_spec.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"

namespace shardline {

// The largest job file the coordinator takes (and shardctl reads): a job's
// record stays small enough that listing many of them never exceeds a message.
constexpr int64_t kMaxJobFileBytes = 256 << 10;

// Parses TOML text; `source` names the file in error messages.
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& toml_text, const std::string& source);

// Every key ParseJobConfig accepts, as "section.key" in the order it reads
// them (docs/job-file.md documents each; a unit test holds the two together).
std::vector<std::string> JobFileKeys();

// A path of the job file (data, init_from, checkpoint dir) as the programs
// see it: relative paths resolve against `base_dir`, the job file's folder.
std::string ResolveJobPath(const std::string& base_dir, const std::string& path);

// The token files `patterns` name, each resolved against `base_dir` and
// glob-expanded (matches in sorted order), in order. A pattern that matches
// nothing is NotFound naming `key` and the pattern.
absl::StatusOr<std::vector<std::string>> ExpandDataPaths(const std::vector<std::string>& patterns,
                                                         const std::string& base_dir, const std::string& key);

}  // namespace shardline
