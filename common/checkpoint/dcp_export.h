// Exporting a committed Shardline checkpoint as a PyTorch Distributed
// Checkpoint (DCP) directory: what torch.distributed.checkpoint.save writes
// for {"model": model_state_dict, "optim": optimizer_state_dict} of
// get_state_dict, so that
//
//   msd, osd = get_state_dict(model, optimizer)   # FSDP2 at any world size, or one process
//   dcp.load({"model": msd, "optim": osd}, checkpoint_id=DIR)
//   set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
//
// continues the run. Names are the engine's (transformers' for the llama
// family, nanoGPT's for gpt2; a tied head is written under both names, as
// their state_dict holds it). The optimizer is AdamW with two parameter
// groups, as the engine (and nanoGPT) groups it: group 0 the tensors of two
// or more dimensions with the job's weight_decay, group 1 the rest with 0;
// each parameter's exp_avg, exp_avg_sq and step (a float32 scalar, the
// checkpoint's step). lr, betas and eps are the job's (`job`: its [optimizer];
// lr the peak, which a training loop's schedule sets each step).
//
// Files: `.metadata` (written last, atomically) and one `__0_0.distcp`, every
// tensor stored float32 (bfloat16 where the checkpoint holds bf16 state, as
// torch.optim.AdamW holds it on a bf16 model; the step stays float32) in
// chunks of at most 64 MiB along its first
// dimension, each a torch.save archive. One unit is read at a time. A LoRA
// checkpoint (adapters only) is refused: export it with --format peft.
// The folder is prepared as the hf export's (PrepareExportDir, ExportKind::kDcp).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"

namespace shardline {

struct DcpExportReport {
  int64_t step = 0;
  int64_t tensors = 0, bytes = 0;
};

absl::StatusOr<DcpExportReport> ExportDcp(const std::string& step_dir, const JobConfig& job,
                                          const std::string& out_dir, bool overwrite);

}  // namespace shardline
