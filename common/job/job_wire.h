// The resolved job spec on the wire: a JobConfig as the coordinator resolved
// it (common/spec/job_spec.h: paths absolute, config.json and the adapter's
// config applied, the attempt's strategy chosen), encoded for the Assignment
// that starts each rank, so that a worker decodes it and validates it and
// reads no job file, config.json or adapter config of its own.
//
// The form is JSON with every field of JobConfig, keyed by the fields' names
// (not the job file's TOML keys: it also carries what no job file says,
// such as max_position_embeddings from config.json and the base digest).
// It is not a user format and not stable across versions: the coordinator
// and its workers run one build.
//
// Contract: DecodeJobConfig never throws. A text that is not such an object,
// lacks a field, or holds a value of another type or out of its type's range
// is InvalidArgument naming `source` and the field; the caller then runs
// ValidateJobConfig, which checks the values as it does a job file's.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/job/job_config.h"

namespace shardline {

// At most this long: a job spec is a few KiB; data path lists are bounded by
// the job file's own limit on the submit.
inline constexpr size_t kMaxJobWireBytes = 4 << 20;

std::string EncodeJobConfig(const JobConfig& c);
absl::StatusOr<JobConfig> DecodeJobConfig(absl::string_view text, const std::string& source);

}  // namespace shardline
