// Importing a PyTorch Distributed Checkpoint (DCP): the directory
// torch.distributed.checkpoint.save wrote (`.metadata` plus `__R_N.distcp`
// files) for an FSDP2 (or any DTensor-sharded) model and its AdamW, turned
// into a committed Shardline checkpoint of one rank, which resumes at any
// world size and strategy like any other (`shardline-train --resume`,
// `shardctl submit --resume-from`).
//
// What is read, per parameter of the job's model: the weights, and AdamW's
// exp_avg, exp_avg_sq and step. The data position is `data_step` where
// given, else the trainer's step where the checkpoint records one
// (torchtitan's `train_state.step`, or a top-level `step` as in
// dcp.save({..., "step": n})), else the step recorded (`step` where given,
// else AdamW's). Names are found in one of three tables
// (README, "Importing a DCP checkpoint"), chosen by which holds the token
// embedding, under the prefix get_state_dict's dict put them (`model.`,
// `optim.state.` / `optimizer.state.`, or none):
//   engine        the engine's names: transformers' for the llama family
//                 (model.layers.0.self_attn.q_proj.weight), nanoGPT's for gpt2
//   torchtitan    torchtitan's Llama (layers.0.attention.wq.weight); wq and
//                 wk are permuted from its interleaved RoPE to transformers'
//                 half-split layout, as transformers' conversion script does
// Nothing runs Python: `.metadata` goes through ParseDcpMetadata, and each
// chunk is read by its byte range from storage_data (torch_saved_tensor.h),
// one parameter at a time: no step holds more than one unit.
//
// Refused, one line naming the file or tensor: a model the checkpoint lacks
// a tensor of, a shape or dtype that disagrees with the job, chunks that do
// not tile their tensor, a missing or short `.distcp`, optimizer steps that
// differ between parameters, and a LoRA job (its checkpoints hold adapters;
// start it from the base with [model] hf_dir instead). A checkpoint without
// optimizer state is refused unless `model_only` (fresh moments, step 0).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"

namespace shardline {

struct DcpImportOptions {
  bool model_only = false;  // weights only: Adam's moments start at zero
  int64_t step = -1;        // the step to record; -1: AdamW's (0 with model_only)
  int64_t data_step = -1;   // the global step whose batch comes next; -1: see below
};

struct DcpImportReport {
  std::string step_dir;  // the committed checkpoint written
  std::string names;     // "engine" or "torchtitan"
  int64_t step = 0;
  int64_t data_step = 0;       // the global step whose batch comes next
  std::string data_step_from;  // "--data-step", "train_state.step", "step" or "the step"
  int64_t tensors_read = 0, bytes_read = 0;
};

// Imports the DCP checkpoint at `dcp_dir` for `job` into
// `checkpoint_root`/step-<8 digits>/ (created; a committed checkpoint already
// there is refused).
absl::StatusOr<DcpImportReport> ImportDcp(const std::string& dcp_dir, const JobConfig& job,
                                          const std::string& checkpoint_root, const DcpImportOptions& options);

}  // namespace shardline
