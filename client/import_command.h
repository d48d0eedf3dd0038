// `shardctl ckpt import`: a PyTorch Distributed Checkpoint (DCP) directory
// turned into a committed Shardline checkpoint for a job file, on this
// machine, with no coordinator (common/checkpoint/dcp_import.h). The job
// then resumes from it at any world size: `shardctl submit JOB.toml
// --resume-from STEP_DIR`, or `shardline-train --resume STEP_DIR`.
//
// Errors are one line naming the flag, the file or the tensor.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"

namespace shardline::ctl {

struct ImportFlags {
  std::string dcp_dir, job_file, out;
  bool model_only = false;
  int64_t step = -1, data_step = -1;
};

// Adds the `ckpt import` subcommand's options to `cmd`.
void AddImportOptions(CLI::App* cmd, ImportFlags* f);
// Runs the import; prints the checkpoint it committed (with `json`, one object).
absl::Status RunImport(const ImportFlags& f, bool json);

}  // namespace shardline::ctl
