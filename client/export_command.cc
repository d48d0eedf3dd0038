#include "client/export_command.h"

#include <cctype>
#include <iostream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/render.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_export.h"
#include "common/checkpoint/dcp_export.h"
#include "common/spec/job_spec.h"

namespace shardline::ctl {

void AddExportOptions(CLI::App* exp, ExportFlags* f) {
  exp->add_option("STEP_DIR", f->step_dir)->required();
  exp->add_option("--out", f->out, "nanogpt: the .safetensors file to write; hf, peft, dcp: the directory")->required();
  exp->add_option("--format", f->format, "nanogpt (one file, the engine's names), hf (a transformers "
                                         "directory), peft (a LoRA checkpoint's adapters) or dcp (a PyTorch "
                                         "Distributed Checkpoint of model and AdamW, for FSDP2 and torchtitan)")
      ->check(CLI::IsMember({"nanogpt", "hf", "peft", "dcp"}));
  exp->add_option("--job", f->job_file, "dcp: the job file the checkpoint was trained with (its [optimizer])");
  exp->add_option("--dtype", f->dtype, "hf, peft: fp32 or bf16 (default fp32)")->check(CLI::IsMember({"fp32", "bf16"}));
  exp->add_flag("--merge", f->merge, "hf, of a LoRA checkpoint: the base with the adapters merged in");
  exp->add_option("--tokenizer", f->tokenizer_dir,
                  "hf: copy the tokenizer and generation_config.json from DIR (default: the model directory the job "
                  "started from, if still there)");
  exp->add_flag("--overwrite", f->overwrite,
                "hf, peft, dcp: export into a folder that has files, removing the weights and configs there first");
  exp->add_option("--max-shard-size", f->max_shard_size,
                  "hf: the largest weight file, as transformers writes it: 5GB, 500MB, 20KB (default 5GB)");
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text, const std::string& flag) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  int64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KB") scale = 1000;
  if (unit == "MB") scale = 1000 * 1000;
  if (unit == "GB") scale = 1000 * 1000 * 1000;
  if (digits == 0 || digits > 9 || scale == 0 || std::stoll(text.substr(0, digits)) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", Quoted(text), ": expected a size such as 5GB, 500MB or 20KB"));
  }
  return std::stoll(text.substr(0, digits)) * scale;
}

absl::Status RunExport(const ExportFlags& a, bool json) {
  const StoredDType dtype = a.dtype == "bf16" ? StoredDType::kBF16 : StoredDType::kF32;
  if (a.merge && a.format != "hf") return absl::InvalidArgumentError("--merge needs --format hf");
  if (!a.tokenizer_dir.empty() && a.format != "hf") {
    return absl::InvalidArgumentError("--tokenizer needs --format hf");
  }
  if (!a.job_file.empty() && a.format != "dcp") return absl::InvalidArgumentError("--job needs --format dcp");
  if (a.format == "dcp") {
    if (a.dtype != "fp32") return absl::InvalidArgumentError("--format dcp writes fp32 (AdamW's state is fp32)");
    if (a.max_shard_size != "5GB") return absl::InvalidArgumentError("--max-shard-size needs --format hf");
    if (a.job_file.empty()) {
      return absl::InvalidArgumentError("--format dcp needs --job JOB.toml: the optimizer settings the DCP holds");
    }
    SL_ASSIGN_OR_RETURN(JobConfig job, ResolveJobFile(a.job_file));
    SL_ASSIGN_OR_RETURN(DcpExportReport r, ExportDcp(a.step_dir, job, a.out, a.overwrite));
    if (json) {
      std::cout << nlohmann::json{{"out", a.out}, {"step", r.step}, {"tensors", r.tensors}, {"bytes", r.bytes}}.dump()
                << std::endl;
    } else {
      std::cout << "wrote " << a.out << " (DCP: " << r.tensors << " tensors, " << r.bytes << " bytes, step " << r.step
                << ")" << std::endl;
    }
    return absl::OkStatus();
  }
  if (a.format == "hf") {
    HfExportOptions options;
    options.dtype = dtype;
    options.merge = a.merge;
    options.overwrite = a.overwrite;
    SL_ASSIGN_OR_RETURN(options.max_shard_bytes, ParseByteSize(a.max_shard_size, "--max-shard-size"));
    options.tokenizer_dir = a.tokenizer_dir;
    SL_ASSIGN_OR_RETURN(HfExportReport report, ExportHf(a.step_dir, a.out, options));
    if (json) {
      std::cout << Dump({{"path", a.out},
                         {"tokenizer_files", report.copied},
                         {"tokenizer_from", report.tokenizer_from.empty() ? Json(nullptr) : Json(report.tokenizer_from)}})
                << std::endl;
    } else if (report.copied.empty()) {
      std::cout << "wrote " << Printable(a.out) << "; no tokenizer copied (" << Printable(report.no_tokenizer)
                << "): pass --tokenizer DIR for one that generates" << std::endl;
    } else {
      std::cout << "wrote " << Printable(a.out) << " with the tokenizer and generation settings of "
                << Printable(report.tokenizer_from) << " (" << report.copied.size() << " files)" << std::endl;
    }
    return absl::OkStatus();
  } else if (a.format == "peft") {
    SL_RETURN_IF_ERROR(ExportPeft(a.step_dir, a.out, dtype, a.overwrite));
  } else {
    if (a.dtype != "fp32") return absl::InvalidArgumentError("--dtype bf16 needs --format hf or peft");
    SL_RETURN_IF_ERROR(ExportModel(a.step_dir, a.out));
  }
  std::cout << (json ? Dump({{"path", a.out}}) : "wrote " + a.out)
            << std::endl;
  return absl::OkStatus();
}

}  // namespace shardline::ctl
