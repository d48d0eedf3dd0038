// The number of tokens in a job's training stream, from the files' headers
// and sizes alone (never their tokens): what `[train] epochs` turns into
// steps and what status divides by to show the epoch, where the data is.
//
// llm.c files count their header's count (checked as TokenDataset::Open
// checks it: magic, version, a file long enough); text files count their
// bytes. Errors name the file: unreadable, or a header that does not parse.
// Reads 1 KiB per file; safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"

namespace shardline {

// `files`: resolved and glob-expanded (ExpandDataPaths), back to back.
// Synthetic data has no files and no size: InvalidArgument.
absl::StatusOr<int64_t> CountTokens(DataFormat format, const std::vector<std::string>& files);

}  // namespace shardline
