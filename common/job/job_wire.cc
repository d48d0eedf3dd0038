#include "common/job/job_wire.h"

#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"

namespace shardline {

// An enum travels as its number, refused outside [0, last].
template <typename E, E kLast>
void EnumToJson(nlohmann::json& j, E e) {
  j = static_cast<int>(e);
}
template <typename E, E kLast>
void EnumFromJson(const nlohmann::json& j, E& e) {
  if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() > static_cast<int64_t>(kLast)) {
    throw std::out_of_range(absl::StrCat("enum value ", j.dump(), " out of range"));
  }
  e = static_cast<E>(j.get<int>());
}
#define SHARDLINE_WIRE_ENUM(E, kLast)                                                  \
  void to_json(nlohmann::json& j, E e) { EnumToJson<E, kLast>(j, e); }                 \
  void from_json(const nlohmann::json& j, E& e) { EnumFromJson<E, kLast>(j, e); }

SHARDLINE_WIRE_ENUM(Strategy, Strategy::kHybridShardZero2)
SHARDLINE_WIRE_ENUM(DType, DType::kBFloat16)
SHARDLINE_WIRE_ENUM(MomentsDType, MomentsDType::kDynamic8Bit)
SHARDLINE_WIRE_ENUM(BackwardPrefetch, BackwardPrefetch::kNone)
SHARDLINE_WIRE_ENUM(DataFormat, DataFormat::kSynthetic)
SHARDLINE_WIRE_ENUM(LoraBase, LoraBase::kReplicated)
SHARDLINE_WIRE_ENUM(LoraBaseDType, LoraBaseDType::kNf4)
SHARDLINE_WIRE_ENUM(GradAccumulation, GradAccumulation::kUnsharded)
SHARDLINE_WIRE_ENUM(LrSchedule, LrSchedule::kWsd)
#undef SHARDLINE_WIRE_ENUM

// One line per struct: every field, in declaration order. A field added to a
// struct in common/job/job_config.h is added here too, or the worker runs
// with its default: JobWire.EveryFieldTravels sets each to a non-default
// value and fails on the one left out.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelConfig, family, n_layer, n_head, n_embd, vocab_size, block_size, init_from,
                                   hf_dir, explicit_keys, n_kv_head, intermediate_size, head_dim_override, rope_theta,
                                   rms_norm_eps, qkv_bias, qk_norm, tie_word_embeddings, rope_scaling,
                                   rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor,
                                   rope_original_max_position, max_position_embeddings, special_token_ids)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TokenSource, paths, mask_paths, doc_paths)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DataConfig, format, train, val)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TrainConfig, steps, batch_size, micro_batch_size, epochs, sequences_per_epoch,
                                   grad_accumulation, auto_grad_accumulation, seed, eval_interval, eval_batches,
                                   log_interval,
                                   max_nonfinite_skips)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OptimizerConfig, lr, min_lr, warmup_steps, schedule, decay_steps, betas, eps,
                                   weight_decay, grad_clip, master_dtype, moments_dtype)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ParallelismConfig, strategy, auto_strategy, shard_group_size, sparse_embedding,
                                   auto_sparse_embedding, shard_optimizer_across_replicas)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(PrecisionConfig, param_dtype, reduce_dtype, buffer_dtype, allow_tf32)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MemoryConfig, activation_checkpointing, cpu_offload, recompute_cheap_ops)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(PrefetchConfig, forward, backward, max_inflight_all_gathers)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LoraConfig, enabled, rank, alpha, target_modules, dropout, init_from, base,
                                   base_dtype, explicit_keys, base_digest)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CheckpointConfig, dir, interval, keep_latest, interval_seconds, async,
                                                at_end)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RestartConfig, max_restarts, min_workers, restart_timeout)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(JobConfig, name, workers, restart, model, data, train, optimizer, parallelism,
                                   precision, memory, prefetch, lora, checkpoint)

std::string EncodeJobConfig(const JobConfig& c) { return nlohmann::json(c).dump(); }

namespace {

// nlohmann turns a float into an int field with static_cast, which is
// undefined behaviour outside int's range (a fuzzer found 1.1e125). The check
// after decoding cannot see that, so the text is walked first beside the
// encoding of a default JobConfig, which has every field's JSON type: a float
// where that holds an integer is refused; where it holds no number to compare
// (a null optional, an empty list), a float past 2^31 is. A double field takes
// any float (a test's lr of 1e30 among them). Walks with its own stack: the
// text may nest deeper than the thread's stack would allow a recursion.
absl::Status RefuseFloatsForInts(const nlohmann::json& root) {
  static const nlohmann::json kTypes = nlohmann::json(JobConfig{});
  struct Node {
    const nlohmann::json* j;
    const nlohmann::json* type;  // null: unknown
    std::string path;            // a JSON pointer, for the error
  };
  std::vector<Node> todo = {{&root, &kTypes, ""}};
  while (!todo.empty()) {
    const Node n = std::move(todo.back());
    todo.pop_back();
    if (n.j->is_number_float()) {
      const bool for_int = n.type && n.type->is_number_integer();
      const bool for_double = n.type && n.type->is_number_float();
      if (for_int || (!for_double && !(std::abs(n.j->get<double>()) < 2147483648.0))) {
        return absl::InvalidArgumentError(
            absl::StrCat(Shown(n.path, 128), ": not a value of its field's type and range, or no such field"));
      }
    } else if (n.j->is_object()) {
      for (auto it = n.j->begin(); it != n.j->end(); ++it) {
        const bool known = n.type && n.type->is_object() && n.type->contains(it.key());
        todo.push_back({&it.value(), known ? &n.type->at(it.key()) : nullptr, n.path + "/" + it.key()});
      }
    } else if (n.j->is_array()) {
      const nlohmann::json* element = n.type && n.type->is_array() && !n.type->empty() ? &n.type->front() : nullptr;
      for (size_t k = 0; k < n.j->size(); ++k) todo.push_back({&(*n.j)[k], element, absl::StrCat(n.path, "/", k)});
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobConfig> DecodeJobConfig(absl::string_view text, const std::string& source) {
  if (text.size() > kMaxJobWireBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": job spec of ", text.size(), " bytes (at most ", kMaxJobWireBytes, ")"));
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end());
    if (!j.is_object()) throw std::invalid_argument("not a JSON object");
    if (absl::Status s = RefuseFloatsForInts(j); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": job spec: ", s.message()));
    }
    JobConfig c = j.get<JobConfig>();
    // nlohmann converts numbers silently (2^40 or 1.5 into an int); what was
    // decoded, encoded again, must be what came, or the first field where
    // they part is named (this also refuses fields JobConfig lacks).
    const nlohmann::json patch = nlohmann::json::diff(j, nlohmann::json(c));
    if (!patch.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": job spec: ", Shown(patch[0].value("path", ""), 128),
                                                     ": not a value of its field's type and range, or no such field"));
    }
    return c;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": job spec: ", Shown(e.what(), 256)));
  }
}

}  // namespace shardline
