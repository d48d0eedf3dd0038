// `shardctl plan`: the per-strategy memory, communication and step-time
// prediction of common/plan/plan.h for a job file or a model given by flags.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "common/plan/plan.h"

namespace shardline::ctl {

struct PlanFlags {
  std::string job_file;
  double params = 0;
  // The model's flags; 0 (or false) where not given. With a job file, each
  // one given replaces the file's key before anything is checked; without
  // one, vocab defaults to 50304 and seq to 2048.
  int layers = 0, hidden = 0, heads = 0, vocab = 0, seq = 0;
  std::string family;               // for --params and --layers/--hidden/--heads (default gpt2)
  std::string device;               // --device: cuda (default) or cpu
  int kv_heads = 0, intermediate = 0;  // llama; 0 = heads, 8/3 x hidden rounded to 256
  int head_dim = 0;                 // 0 = hidden / heads (Qwen3 sets its own)
  bool tied = false;                // llama: tie the head to the embedding
  bool qk_norm = false;             // llama: RMSNorm over each head of q and k (Qwen3)
  std::string reduce_dtype;         // bf16 | fp32; default: the job file's, else fp32
  std::string optimizer_state;      // fp32 | bf16 | 8bit: master and moments; default: the job file's, else fp32
  int workers = 0, batch = 0, micro_batch = 0, shard_group = 0;
  std::string dtype;  // bf16 | fp32; default: the job file's, else bf16
  std::string grad_accumulation;  // sharded | unsharded; default: the job file's, else sharded
  bool sparse_embedding = false;  // or the job file's [parallelism] sparse_embedding
  // LoRA: --lora-rank > 0 plans adapters on the --lora-targets projections
  // (comma-separated, or all-linear; default PEFT's) over a --lora-base
  // (sharded | replicated) frozen base.
  int lora_rank = 0;
  std::string lora_targets, lora_base, lora_base_dtype;
  ClusterSpec cluster;
};

// Adds the `plan` subcommand's options to `cmd`.
void AddPlanOptions(CLI::App* cmd, PlanFlags* f);
absl::Status RunPlan(const PlanFlags& f, bool json);

}  // namespace shardline::ctl
