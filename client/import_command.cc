#include "client/import_command.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/dcp_import.h"
#include "common/spec/job_spec.h"

namespace shardline::ctl {

void AddImportOptions(CLI::App* cmd, ImportFlags* f) {
  cmd->add_option("DCP_DIR", f->dcp_dir, "the directory torch.distributed.checkpoint.save wrote")->required();
  cmd->add_option("--job", f->job_file, "the job file (TOML) that will resume from it")->required();
  cmd->add_option("--out", f->out, "the checkpoint root to write step-<N>/ into")->required();
  cmd->add_flag("--model-only", f->model_only, "weights only: no optimizer state (Adam starts afresh at step 0)");
  cmd->add_option("--step", f->step, "the step to record (default: AdamW's step in the checkpoint)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--data-step", f->data_step, "the global step whose batch comes next (default: the trainer's step the checkpoint records, else the step)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
}

absl::Status RunImport(const ImportFlags& f, bool json) {
  SL_ASSIGN_OR_RETURN(JobConfig job, ResolveJobFile(f.job_file));
  SL_RETURN_IF_ERROR(ValidateJobConfig(job, job.workers, f.job_file));
  SL_ASSIGN_OR_RETURN(DcpImportReport r, ImportDcp(f.dcp_dir, job, f.out, {f.model_only, f.step, f.data_step}));
  if (json) {
    std::cout << nlohmann::json{{"step_dir", r.step_dir},          {"step", r.step},
                                {"data_step", r.data_step},        {"data_step_from", r.data_step_from},
                                {"names", r.names},                {"tensors_read", r.tensors_read},
                                {"bytes_read", r.bytes_read}}
                     .dump()
              << std::endl;
  } else {
    // Paths as the user typed them may hold anything: escaped, as every message is.
    std::cout << "imported " << Shown(f.dcp_dir, 1024) << " (" << r.names << " names, " << r.tensors_read
              << " tensors, " << r.bytes_read << " bytes) as step " << r.step << ", data from step " << r.data_step
              << " (" << r.data_step_from << "): " << Shown(r.step_dir, 1024) << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace shardline::ctl
