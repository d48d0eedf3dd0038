// `shardctl ckpt export`: a committed checkpoint written for other tools, on
// this machine, with no coordinator (common/checkpoint/checkpoint_export.h):
// one safetensors file of the engine's names (nanogpt), a transformers
// directory (hf), a PEFT adapter directory (peft) or a PyTorch Distributed
// Checkpoint of model and AdamW (dcp, which takes the job file for the
// optimizer's settings).
//
// Errors are one line naming the flag or the file; nothing is written where
// a flag is refused.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline::ctl {

struct ExportFlags {
  std::string step_dir, out;
  std::string format = "nanogpt", dtype = "fp32", max_shard_size = "5GB", tokenizer_dir, job_file;
  bool merge = false, overwrite = false;
};

// Adds the `ckpt export` subcommand's options to `cmd`.
void AddExportOptions(CLI::App* cmd, ExportFlags* f);
// Runs the export; prints what it wrote (with `json`, one object).
absl::Status RunExport(const ExportFlags& f, bool json);

// "5GB", "500MB", "20KB" or "4096" (bytes; powers of 1000, as transformers);
// an error names `flag`.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text, const std::string& flag);

}  // namespace shardline::ctl
