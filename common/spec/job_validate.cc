// ValidateJobConfig (common/spec/job_spec.h), one section at a time, in the
// order its errors are reported.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/model/model_shapes.h"
#include "common/spec/job_spec.h"

namespace shardline {
namespace {

// "<src>: [<section>] <msg>", the form of every refusal.
auto Refusal(const std::string& src) {
  return [&src](const std::string& section, const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": [", section, "] ", msg));
  };
}

// Text every user is shown: the name in listings, the paths in `status`,
// `ckpt list` and the messages that name them.
absl::Status ValidateShownText(const JobConfig& c, const std::string& src) {
  const auto bad = Refusal(src);
  // The name is shown to every user in listings and dashboards: a control
  // character (an escape sequence) there would reach their terminals.
  if (c.name.size() > kMaxJobNameBytes || !IsPrintable(c.name)) {
    return bad("job", absl::StrCat("name = ", Quoted(c.name), ": at most ", kMaxJobNameBytes,
                                   " bytes and no control characters"));
  }
  // So are its paths (`status`, `ckpt list`, the messages that name them).
  const std::pair<const char*, const std::string*> paths[] = {
      {"[model] init_from", &c.model.init_from}, {"[model] hf_dir", &c.model.hf_dir},
      {"[lora] init_from", &c.lora.init_from},   {"[checkpoint] dir", &c.checkpoint.dir}};
  std::vector<std::pair<std::string, const std::string*>> all(std::begin(paths), std::end(paths));
  for (const std::string& p : c.data.train.paths) all.emplace_back("[data] path", &p);
  for (const std::string& p : c.data.train.mask_paths) all.emplace_back("[data] mask_path", &p);
  for (const std::string& p : c.data.val.paths) all.emplace_back("[data] val_path", &p);
  for (const std::string& p : c.data.val.mask_paths) all.emplace_back("[data] val_mask_path", &p);
  for (const std::string& p : c.data.train.doc_paths) all.emplace_back("[data] doc_path", &p);
  for (const std::string& p : c.data.val.doc_paths) all.emplace_back("[data] val_doc_path", &p);
  for (const auto& [key, path] : all) {
    if (!IsPrintable(*path)) {
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": ", key, " = ", Quoted(*path), ": control characters are not allowed in a path"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const ModelConfig& m, const std::string& src) {
  const auto bad = Refusal(src);
  if (m.family != "gpt2" && m.family != "llama") {
    return bad("model", absl::StrCat("family = ", Quoted(m.family), ": expected gpt2 or llama"));
  }
  if (m.n_layer < 1) return bad("model", "n_layer must be >= 1");
  if (m.n_head < 1) return bad("model", "n_head must be >= 1");
  if (m.n_embd < 1) return bad("model", "n_embd must be >= 1");
  if (m.n_embd % m.n_head != 0) {
    return bad("model", absl::StrCat("n_embd = ", m.n_embd, " is not divisible by n_head = ", m.n_head));
  }
  if (m.vocab_size < 2) return bad("model", "vocab_size must be >= 2");
  if (m.is_llama()) {
    if (m.n_kv_head < 0 || m.n_head % m.kv_heads() != 0) {
      return bad("model", absl::StrCat("n_head = ", m.n_head, " is not a multiple of n_kv_head = ", m.n_kv_head));
    }
    if (m.head_dim_override < 0) return bad("model", "head_dim must be >= 1 (or 0: n_embd / n_head)");
    if (m.head_dim() % 2 != 0) return bad("model", "head_dim must be even (rotary embeddings rotate pairs)");
    if (m.intermediate_size < 1) return bad("model", "intermediate_size must be >= 1 for family = \"llama\"");
    if (!(m.rope_theta > 0) || !(m.rms_norm_eps > 0)) return bad("model", "rope_theta and rms_norm_eps must be > 0");
    if (m.rope_scaling != "none" && m.rope_scaling != "llama3") {
      return bad("model", absl::StrCat("rope_scaling = ", Quoted(m.rope_scaling), ": expected none or llama3"));
    }
    if (m.rope_scaling == "llama3" &&
        (!(m.rope_scaling_factor > 0) || !(m.rope_high_freq_factor > m.rope_low_freq_factor) ||
         m.rope_low_freq_factor <= 0 || m.rope_original_max_position < 1)) {
      return bad("model", "rope_scaling = \"llama3\" needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
                          "rope_original_max_position >= 1");
    }
  }
  if (m.block_size < 1) return bad("model", "block_size must be >= 1");
  // Bounded before anything is allocated or computed from it. Counted in
  // double: keys each within their own bound still multiply past int64.
  constexpr double kMaxParams = 1e13;
  const double params = model::ApproxNumParams(m);
  if (params > kMaxParams) {
    return bad("model", absl::StrFormat("the model has %.3g parameters, more than the limit of %.0e", params,
                                        kMaxParams));
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const JobConfig& c, const std::string& src) {
  const auto bad = Refusal(src);
  const ModelConfig& m = c.model;
  const DataConfig& d = c.data;
  if (d.format != DataFormat::kSynthetic && d.train.empty()) {
    return bad("data", "path is required unless format = \"synthetic\"");
  }
  if (d.format == DataFormat::kSynthetic && (!d.train.empty() || !d.val.empty() || !d.train.mask_paths.empty())) {
    return bad("data", "format = \"synthetic\" reads no files: remove path, mask_path and val_path");
  }
  for (const TokenSource* ts : {&d.train, &d.val}) {
    if (!ts->mask_paths.empty() && d.format != DataFormat::kLlmc) {
      return bad("data", "loss masks (mask_path, val_mask_path) need format = \"llmc\"");
    }
    if (!ts->doc_paths.empty() && d.format != DataFormat::kLlmc) {
      return bad("data", "document starts (doc_path, val_doc_path) need format = \"llmc\"");
    }
  }
  if (d.val.empty() && !d.val.mask_paths.empty()) return bad("data", "val_mask_path needs val_path");
  if (d.val.empty() && !d.val.doc_paths.empty()) return bad("data", "val_doc_path needs val_path");
  if (c.train.eval_interval < 0) return bad("train", "eval_interval must be >= 0 (0: no validation)");
  if (c.train.eval_batches < 1) return bad("train", "eval_batches must be >= 1");
  if (c.train.eval_interval > 0 && d.val.empty() && d.format != DataFormat::kSynthetic) {
    return bad("train", absl::StrCat("eval_interval = ", c.train.eval_interval, " needs [data] val_path"));
  }
  if (c.data.format == DataFormat::kText && m.vocab_size < 256) {
    return bad("model", "vocab_size must be >= 256 for format = \"text\" (bytes are tokens)");
  }
  return absl::OkStatus();
}

// The optimizer state's dtypes: fp32 master and moments, bf16 both on bf16
// parameters (the update then runs torch.optim.AdamW's bf16 ops on the
// parameters themselves: worker/engine/optimizer.h), or 8-bit moments with
// either master (bitsandbytes' AdamW8bit: worker/engine/adamw_8bit.h).
absl::Status ValidateOptimizerState(const JobConfig& c, const std::string& src) {
  const auto bad = Refusal(src);
  const OptimizerConfig& o = c.optimizer;
  const bool bf16_master = o.master_dtype == DType::kBFloat16;
  if (bf16_master && c.precision.param_dtype != DType::kBFloat16) {
    return bad("optimizer", "master_dtype = \"bf16\" updates the parameters in place and needs [precision] "
                            "param_dtype = \"bf16\"");
  }
  if (!MomentsPairWithMaster(o.moments_dtype, o.master_dtype)) {
    return bad("optimizer", absl::StrCat("moments_dtype = \"", MomentsDTypeName(o.moments_dtype),
                                         "\" with master_dtype = \"", bf16_master ? "bf16" : "fp32",
                                         "\" is not supported: give both \"fp32\" or both \"bf16\", or "
                                         "moments_dtype = \"8bit\""));
  }
  return absl::OkStatus();
}

// Batches, workers, restarts, the optimizer, sharding, prefetch and memory.
absl::Status ValidateTraining(const JobConfig& c, int world, const std::string& src) {
  const auto bad = Refusal(src);
  const TrainConfig& t = c.train;
  if (t.steps < 1) return bad("train", "steps must be >= 1");
  if (t.batch_size < 1) return bad("train", "batch_size must be >= 1");
  if (t.micro_batch_size < 1) return bad("train", "micro_batch_size must be >= 1");
  if (world < 1) return bad("job", "workers must be >= 1");
  if (c.restart.min_workers > world) {
    return bad("job", absl::StrCat("min_workers = ", c.restart.min_workers, " is more than the ", world, " workers"));
  }
  if (!(c.restart.restart_timeout >= 1 && c.restart.restart_timeout <= 7 * 24 * 3600)) {
    return bad("job", "restart_timeout must be in [1, 604800] seconds");
  }
  if (t.batch_size % world != 0) {
    return bad("train", absl::StrCat("batch_size = ", t.batch_size,
                                     " is not divisible by the world size ", world));
  }
  if ((t.batch_size / world) % t.micro_batch_size != 0) {
    return bad("train", absl::StrCat("micro_batch_size = ", t.micro_batch_size,
                                     " does not divide the per-rank batch ", t.batch_size / world));
  }
  const OptimizerConfig& o = c.optimizer;
  if (!(o.lr >= 0)) return bad("optimizer", "lr must be >= 0");
  if (!(o.min_lr >= 0)) return bad("optimizer", "min_lr must be >= 0");
  if (o.warmup_steps < 0) return bad("optimizer", "warmup_steps must be >= 0");
  if (o.schedule == LrSchedule::kWsd) {
    if (o.decay_steps < 1 || o.decay_steps > t.steps - o.warmup_steps) {
      return bad("optimizer", absl::StrCat("schedule = \"wsd\" needs decay_steps in [1, steps - warmup_steps = ",
                                           t.steps - o.warmup_steps, "], not ", o.decay_steps));
    }
    if (!(o.min_lr <= o.lr)) return bad("optimizer", "schedule = \"wsd\" decays to min_lr, which must be <= lr");
  } else if (o.decay_steps != 0) {
    return bad("optimizer", absl::StrCat("decay_steps is for schedule = \"wsd\", not \"",
                                         LrScheduleName(o.schedule), "\""));
  }
  for (double b : o.betas) {
    if (!(b >= 0 && b < 1)) return bad("optimizer", "betas must lie in [0, 1)");
  }
  if (!(o.eps > 0)) return bad("optimizer", "eps must be > 0");
  if (!(o.weight_decay >= 0)) return bad("optimizer", "weight_decay must be >= 0");
  if (!(o.grad_clip >= 0)) return bad("optimizer", "grad_clip must be >= 0 (0 disables clipping)");
  SL_RETURN_IF_ERROR(ValidateOptimizerState(c, src));
  const int g = c.parallelism.shard_group_size;
  if (IsHybrid(c.parallelism.strategy)) {
    if (g < 0 || (g > 0 && world % g != 0)) {
      return bad("parallelism", absl::StrCat("shard_group_size = ", g,
                                             " must divide the world size ", world));
    }
  }
  if (c.parallelism.shard_optimizer_across_replicas && !c.parallelism.auto_strategy &&
      c.parallelism.strategy != Strategy::kHybridShard) {
    return bad("parallelism", absl::StrCat("shard_optimizer_across_replicas is for strategy = \"hybrid_shard\", not \"",
                                           StrategyName(c.parallelism.strategy), "\""));
  }
  if (c.prefetch.max_inflight_all_gathers < 1) {
    return bad("prefetch", "max_inflight_all_gathers must be >= 1");
  }
  if (c.memory.cpu_offload) return bad("memory", "cpu_offload = true is not supported yet");
  return absl::OkStatus();
}

absl::Status ValidateLora(const LoraConfig& l, const ModelConfig& m, const std::string& src) {
  auto bad = [&](const std::string& msg) { return absl::InvalidArgumentError(absl::StrCat(src, ": [lora] ", msg)); };
  if (l.rank < 1) return bad("rank must be >= 1");
  if (!(l.alpha > 0)) return bad("alpha must be > 0");
  if (l.dropout != 0) {
    return bad(absl::StrCat("dropout = ", l.dropout, " is not supported: adapters train without dropout (set 0)"));
  }
  const std::vector<std::string> names = model::LoraModuleNames(m);
  for (const std::string& t : l.target_modules) {
    if (t == "all-linear" && l.target_modules.size() == 1) continue;
    if (std::find(names.begin(), names.end(), t) == names.end()) {
      return bad(absl::StrCat("target_modules: ", Quoted(t), " is not a projection of family ", Quoted(m.family),
                              " (expected \"all-linear\" or some of ", absl::StrJoin(names, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const CheckpointConfig& k, const std::string& src) {
  const auto bad = Refusal(src);
  if (k.interval < 0) return bad("checkpoint", "interval must be >= 0");
  if (!(k.interval_seconds >= 0 && k.interval_seconds <= 30 * 24 * 3600)) {
    return bad("checkpoint", "interval_seconds must be in [0, 2592000] (0: by steps only)");
  }
  if (k.keep_latest < 0) return bad("checkpoint", "keep_latest must be >= 0");
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobConfig(const JobConfig& c, int world, const std::string& src) {
  SL_RETURN_IF_ERROR(ValidateShownText(c, src));
  SL_RETURN_IF_ERROR(ValidateModel(c.model, src));
  SL_RETURN_IF_ERROR(ValidateData(c, src));
  SL_RETURN_IF_ERROR(ValidateTraining(c, world, src));
  if (c.lora.enabled) SL_RETURN_IF_ERROR(ValidateLora(c.lora, c.model, src));
  return ValidateCheckpoint(c.checkpoint, src);
}

}  // namespace shardline
