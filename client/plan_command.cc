#include "client/plan_command.h"

#include <algorithm>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/job/job_config.h"
#include "common/model/model_shapes.h"
#include "common/plan/strategy_choice.h"
#include "common/plan/ways_to_fit.h"
#include "common/spec/job_spec.h"

namespace shardline::ctl {

namespace {

// Every flag is bounded where it is parsed (CLI11 names the flag): sizes as
// a job file's keys are (common/job/job_config.cc), so that nothing planned is
// larger than a job could be; rates and sizes in [1, hi], NaN and
// infinities refused (CLI::Range lets a NaN through).
constexpr int kMaxRanks = 1 << 20;
constexpr double kMaxParams = 1e13;  // ValidateJobConfig's parameter limit
constexpr int kDefaultVocab = 50304, kDefaultSeq = 2048;  // without a job file

CLI::Validator Within(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& in) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(in, v) && v >= lo && v <= hi) return std::string();
        return absl::StrFormat("%s is not a number in [%g, %g]", in, lo, hi);
      },
      absl::StrFormat("in [%g, %g]", lo, hi));
}

}  // namespace

void AddPlanOptions(CLI::App* cmd, PlanFlags* f) {
  cmd->add_option("JOB.toml", f->job_file, "a job file: its model, batch, precision and workers");
  cmd->add_option("--params", f->params, "or a model of this many parameters (e.g. 7e9), shaped as --family's")
      ->check(Within(1, kMaxParams));
  cmd->add_option("--family", f->family, "gpt2 (default) or llama (GQA, SwiGLU, untied head)")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  cmd->add_option("--kv-heads", f->kv_heads, "llama: key/value heads (default: --heads)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--intermediate", f->intermediate, "llama: SwiGLU width (default: 8/3 x hidden, rounded to 256)")
      ->check(CLI::Range(1, 1 << 22));
  cmd->add_option("--head-dim", f->head_dim, "llama: the width of one head (default: hidden / heads; Qwen3: 128)")
      ->check(CLI::Range(1, 65536));
  cmd->add_flag("--tied", f->tied, "llama: the head is the token embedding");
  cmd->add_flag("--qk-norm", f->qk_norm, "llama: RMSNorm over each head of q and k (Qwen3)");
  cmd->add_option("--layers", f->layers, "or the shape: layers")->check(CLI::Range(1, 10000));
  cmd->add_option("--hidden", f->hidden, "hidden size")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--heads", f->heads, "attention heads")->check(CLI::Range(1, 65536));
  cmd->add_option("--vocab", f->vocab, "vocabulary size (default: the job file's, else 50304)")
      ->check(CLI::Range(2, 1 << 24));
  cmd->add_option("--seq", f->seq, "sequence length (default: the job file's, else 2048)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--workers", f->workers, "world size (default: the job file's, else 8)")
      ->check(CLI::Range(1, kMaxRanks));
  cmd->add_option("--device", f->device, "what a rank computes on, for what its allocator and process hold beyond "
                                         "its tensors: cuda (default) or cpu")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_option("--gpus-per-node", f->cluster.gpus_per_node, "devices per node (hybrid groups stay in a node)")
      ->check(CLI::Range(1, kMaxRanks));
  cmd->add_option("--gpu-memory", f->cluster.device_memory_bytes, "bytes of memory per device, decimal (80e9 is 80 GB, 74.5 GiB)")
      ->check(Within(1, 1e15));
  cmd->add_option("--intra-bw", f->cluster.intra_node_bw, "bytes/s per rank inside a node (bus bandwidth)")
      ->check(Within(1, 1e15));
  cmd->add_option("--inter-bw", f->cluster.inter_node_bw, "bytes/s per rank between nodes")->check(Within(1, 1e15));
  cmd->add_option("--flops", f->cluster.flops, "achieved FLOP/s per device")->check(Within(1, 1e18));
  cmd->add_option("--mem-bw", f->cluster.memory_bw, "memory bytes/s per device (optimizer step)")
      ->check(Within(1, 1e15));
  cmd->add_option("--comm-cpu-per-byte", f->cluster.comm_cpu_s_per_byte,
                  "seconds of a rank's compute each byte it sends costs (0, the default: GPUs; Gloo on CPU "
                  "workers that share cores: about 1 / loopback bus bandwidth)")
      ->check(Within(0, 1));
  cmd->add_option("--batch", f->batch, "global batch in sequences (default: the job file's)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--micro-batch", f->micro_batch, "sequences per rank per forward (default: the job file's, else 1)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--grad-accumulation", f->grad_accumulation,
                  "over several micro-batches: sharded (reduce each) or unsharded (hold whole gradients); default: "
                  "the job file's, else sharded")
      ->check(CLI::IsMember({"sharded", "unsharded"}));
  cmd->add_flag("--sparse-embedding", f->sparse_embedding,
                "a sharded token table is looked up by moving its tokens' rows (untied: never gathered) (default: the job file's)");
  cmd->add_option("--shard-group", f->shard_group, "hybrid shard group size (default: --gpus-per-node)")
      ->check(CLI::Range(1, kMaxRanks));
  cmd->add_option("--dtype", f->dtype, "parameter dtype, bf16 or fp32 (default: the job file's, else bf16)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  cmd->add_option("--reduce-dtype", f->reduce_dtype, "gradient reduction dtype, bf16 or fp32 (default: the job "
                                                     "file's, else fp32; fp32 with --dtype fp32)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  cmd->add_option("--optimizer-state", f->optimizer_state,
                  "AdamW's master and moments: fp32, bf16 (no master: bf16 parameters updated in place, "
                  "with --dtype bf16), or 8bit (an fp32 master, bitsandbytes' 8-bit moments) (default: the job "
                  "file's, else fp32)")
      ->check(CLI::IsMember({"bf16", "fp32", "8bit"}));
  cmd->add_option("--lora-rank", f->lora_rank, "LoRA: adapters of this rank on a frozen base (default: the job "
                                               "file's [lora], else none)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--lora-targets", f->lora_targets, "LoRA: projections, comma-separated, or all-linear (default: "
                                                     "PEFT's, q_proj,v_proj for llama, c_attn for gpt2)");
  cmd->add_option("--lora-base", f->lora_base, "LoRA: the frozen base sharded (default) or replicated")
      ->check(CLI::IsMember({"sharded", "replicated"}));
  cmd->add_option("--lora-base-dtype", f->lora_base_dtype,
                  "LoRA: the frozen base in the parameter dtype (param_dtype, default) or, QLoRA, its blocks' "
                  "matrices in 4-bit NF4 (nf4)")
      ->check(CLI::IsMember({"param_dtype", "nf4"}));
}

namespace {

// --lora-* over the job file's [lora] (if any), validated as a job's would be.
absl::Status ApplyLoraFlags(const PlanFlags& f, PlanInput* in) {
  LoraConfig& l = in->lora;
  if (f.lora_rank == 0 && f.lora_targets.empty() && f.lora_base.empty() && f.lora_base_dtype.empty()) {
    return absl::OkStatus();
  }
  if (f.lora_rank < 0) return absl::InvalidArgumentError("plan: --lora-rank must be at least 1");
  if (!l.enabled && f.lora_rank == 0) {
    return absl::InvalidArgumentError(
        "plan: --lora-targets, --lora-base and --lora-base-dtype need --lora-rank (a frozen base is LoRA's)");
  }
  l.enabled = true;
  if (f.lora_rank > 0) l.rank = f.lora_rank;
  if (!f.lora_targets.empty()) l.target_modules = absl::StrSplit(f.lora_targets, ',', absl::SkipEmpty());
  if (!f.lora_base.empty()) l.base = f.lora_base == "replicated" ? LoraBase::kReplicated : LoraBase::kSharded;
  if (!f.lora_base_dtype.empty()) {
    l.base_dtype = f.lora_base_dtype == "nf4" ? LoraBaseDType::kNf4 : LoraBaseDType::kParamDType;
  }
  JobConfig c;
  c.model = in->model;
  c.lora = l;
  c.train.batch_size = c.train.micro_batch_size = 1;
  absl::Status s = ValidateJobConfig(c, 1, "plan");
  if (!s.ok() && absl::StrContains(s.message(), "[lora]")) {
    return absl::InvalidArgumentError(absl::StrReplaceAll(s.message(), {{"plan: [lora] ", "plan: --lora-"},
                                                                         {"target_modules", "targets"}}));
  }
  return absl::OkStatus();
}

// The flags given (model and batch) replace the job file's keys, before the
// file is validated: what is planned is the job as the flags change it.
void ApplyFlagsToJob(const PlanFlags& f, JobConfig* c) {
  ModelConfig& m = c->model;
  if (!f.family.empty()) m.family = f.family;
  if (f.layers > 0) m.n_layer = f.layers;
  if (f.hidden > 0) m.n_embd = f.hidden;
  if (f.heads > 0) m.n_head = f.heads;
  if (f.vocab > 0) m.vocab_size = f.vocab;
  if (f.seq > 0) m.block_size = f.seq;
  if (f.kv_heads > 0) m.n_kv_head = f.kv_heads;
  if (f.intermediate > 0) m.intermediate_size = f.intermediate;
  if (f.head_dim > 0) m.head_dim_override = f.head_dim;
  if (f.tied) m.tie_word_embeddings = true;
  if (f.qk_norm) m.qk_norm = true;
  if (f.batch > 0) c->train.batch_size = f.batch;
  if (f.micro_batch > 0) c->train.micro_batch_size = f.micro_batch;
}

// For a job file that says strategy = "auto": what the coordinator would
// pick on the flags' cluster, had its ranks measured the flags' bandwidth
// (between nodes where the world spans several), from the job file's keys.
absl::StatusOr<std::optional<StrategyChoice>> AutoPick(const JobConfig& config, const ClusterSpec& cluster) {
  if (!config.parallelism.auto_strategy) return std::optional<StrategyChoice>();
  AttemptCluster a;
  a.world = cluster.workers;
  a.ranks_per_host = std::min(cluster.gpus_per_node, cluster.workers);
  a.hosts = (a.world + a.ranks_per_host - 1) / a.ranks_per_host;
  if (a.hosts * a.ranks_per_host != a.world) a.ranks_per_host = 0;
  a.min_memory_bytes = static_cast<int64_t>(std::min(cluster.device_memory_bytes, 9e18));
  a.measured_bus_bandwidth = a.hosts > 1 ? cluster.inter_node_bw : cluster.intra_node_bw;
  SL_ASSIGN_OR_RETURN(StrategyChoice pick, ChooseStrategyOn(config, a, cluster));
  return std::optional<StrategyChoice>(std::move(pick));
}

}  // namespace

absl::Status RunPlan(const PlanFlags& f, bool json) {
  PlanInput in;
  in.cluster = f.cluster;
  in.cluster.workers = 8;
  std::optional<StrategyChoice> auto_pick;
  if (!f.job_file.empty()) {
    SL_ASSIGN_OR_RETURN(JobConfig config, ResolveJobFile(f.job_file));
    ApplyFlagsToJob(f, &config);
    // As `submit --workers` would check it (its files aside: they need not
    // exist where a job is planned), before anything is computed from it.
    const int world = f.workers > 0 ? f.workers : config.workers;
    SL_RETURN_IF_ERROR(ValidateJobConfig(config, world, f.job_file));
    const ClusterSpec flags = in.cluster;
    in = PlanInputForJob(config, world);
    in.cluster = flags;
    in.cluster.workers = world;
    SL_ASSIGN_OR_RETURN(auto_pick, AutoPick(config, in.cluster));
  } else if (f.layers > 0 || f.hidden > 0 || f.heads > 0) {
    if (f.layers <= 0 || f.hidden <= 0 || f.heads <= 0) {
      return absl::InvalidArgumentError("plan: --layers, --hidden and --heads go together");
    }
    in.model.family = f.family.empty() ? "gpt2" : f.family;
    in.model.n_layer = f.layers;
    in.model.n_embd = f.hidden;
    in.model.n_head = f.heads;
    in.model.vocab_size = f.vocab > 0 ? f.vocab : kDefaultVocab;
    in.model.block_size = f.seq > 0 ? f.seq : kDefaultSeq;
    if (in.model.is_llama()) {
      in.model.n_kv_head = f.kv_heads;
      in.model.intermediate_size =
          f.intermediate > 0 ? f.intermediate : DefaultIntermediateSize(f.hidden);
      in.model.head_dim_override = f.head_dim;
      in.model.tie_word_embeddings = f.tied;
      in.model.qk_norm = f.qk_norm;
    }
  } else if (f.params > 0) {
    in.model = ModelForParams(f.params, f.vocab > 0 ? f.vocab : kDefaultVocab, f.seq > 0 ? f.seq : kDefaultSeq,
                              f.family.empty() ? "gpt2" : f.family);
    if (in.model.is_llama()) in.model.tie_word_embeddings = f.tied;
  } else {
    return absl::InvalidArgumentError("plan: give a JOB.toml, --params, or --layers/--hidden/--heads");
  }
  if (f.workers > 0) in.cluster.workers = f.workers;
  if (f.device == "cpu") in.cluster.device = DeviceKind::kCpu;
  if (f.job_file.empty() && f.batch > 0) in.batch_size = f.batch;
  if (f.job_file.empty() && f.micro_batch > 0) in.micro_batch_size = f.micro_batch;
  if (!f.grad_accumulation.empty()) {
    in.grad_accumulation =
        f.grad_accumulation == "unsharded" ? GradAccumulation::kUnsharded : GradAccumulation::kSharded;
  }
  if (f.shard_group > 0) in.shard_group_size = f.shard_group;
  in.sparse_embedding = in.sparse_embedding || f.sparse_embedding;
  if (!f.dtype.empty()) {
    in.param_dtype = f.dtype == "fp32" ? DType::kFloat32 : DType::kBFloat16;
    if (in.param_dtype == DType::kFloat32) in.reduce_dtype = DType::kFloat32;
  }
  if (!f.reduce_dtype.empty()) in.reduce_dtype = f.reduce_dtype == "fp32" ? DType::kFloat32 : DType::kBFloat16;
  if (!f.optimizer_state.empty()) {
    in.master_dtype = f.optimizer_state == "bf16" ? DType::kBFloat16 : DType::kFloat32;
    in.moments_dtype = f.optimizer_state == "bf16"   ? MomentsDType::kBFloat16
                       : f.optimizer_state == "8bit" ? MomentsDType::kDynamic8Bit
                                                     : MomentsDType::kFloat32;
  }
  SL_RETURN_IF_ERROR(ApplyLoraFlags(f, &in));
  absl::StatusOr<Plan> made = MakePlan(in);
  if (!made.ok() && f.job_file.empty() && absl::StartsWith(made.status().message(), "plan: [model] ")) {
    // The model's checks speak of job-file keys; here the flags gave it.
    const char* flags = f.layers > 0 ? "--layers/--hidden/--heads" : "--params";
    return absl::InvalidArgumentError(absl::StrReplaceAll(made.status().message(),
                                                          {{"plan: [model] ", absl::StrCat("plan: ", flags, ": ")}}));
  }
  SL_ASSIGN_OR_RETURN(Plan plan, std::move(made));
  const std::optional<WaysToFit> fits = plan.recommended.empty() ? std::optional<WaysToFit>(FindWaysToFit(in))
                                                                 : std::nullopt;
  if (json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::parse(PlanJson(plan));
    if (fits) out.update(nlohmann::ordered_json::parse(WaysToFitJson(*fits)));
    if (auto_pick) {
      out["auto"] = {{"strategy", StrategyName(auto_pick->strategy)},
                     {"shard_group_size", auto_pick->shard_group_size},
                     {"grad_accumulation", GradAccumulationName(auto_pick->grad_accumulation)},
                     {"sparse_embedding", auto_pick->sparse_embedding},
                     {"why", auto_pick->why}};
    }
    std::cout << out.dump() << std::endl;
  } else {
    const ModelConfig& m = in.model;
    const std::string llama = m.is_llama() ? absl::StrCat(" (", m.kv_heads(), " kv), SwiGLU ", m.intermediate_size,
                                                          m.tied() ? ", tied" : ", untied head")
                                           : "";
    const std::string lora =
        in.lora.enabled ? absl::StrCat("; LoRA rank ", in.lora.rank, " on ",
                                       absl::StrJoin(model::LoraModules(m, in.lora), ","), ", base ",
                                       LoraBaseName(in.lora.base))
                        : "";
    std::cout << absl::StrCat("model: ", m.family, ", ", in.model.n_layer, " layers, hidden ", in.model.n_embd, ", ",
                              in.model.n_head, " heads", llama, ", vocab ", in.model.vocab_size, ", seq ",
                              in.model.block_size, lora, "; ", in.cluster.workers, " workers, ",
                              in.cluster.gpus_per_node, " per node\n")
              << PlanTable(plan);
    if (fits) std::cout << WaysToFitTable(*fits, in);
    if (auto_pick) std::cout << "strategy = \"auto\" here: " << auto_pick->why << "\n";
  }
  return absl::OkStatus();
}

}  // namespace shardline::ctl
