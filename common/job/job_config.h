// JobConfig: the job of docs/design.md as types, and the names of its enums.
// Its job file (TOML) is read by common/job/job_file.h; its wire form, the
// resolved spec an Assignment carries, is common/job/job_wire.h; a job file
// resolved against the files it names and validated is common/spec/job_spec.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline {

enum class Strategy { kNoShard, kZero1, kShardGradOp, kFullShard, kHybridShard, kHybridShardZero2 };
enum class DType { kFloat32, kBFloat16 };
// Adam's moments: in a DType, or in 8 bits as bitsandbytes' AdamW8bit keeps
// them (blockwise dynamic quantization: common/model/moment_blocks.h).
enum class MomentsDType { kFloat32, kBFloat16, kDynamic8Bit };
const char* MomentsDTypeName(MomentsDType d);
// Whether the optimizer runs these moments beside a master of this dtype:
// dense moments share the master's dtype; 8-bit ones take either.
bool MomentsPairWithMaster(MomentsDType moments, DType master);
enum class BackwardPrefetch { kPre, kPost, kNone };
enum class DataFormat { kLlmc, kText, kSynthetic };

const char* StrategyName(Strategy s);
absl::StatusOr<Strategy> ParseStrategy(const std::string& s);

// Parameters stay sharded between steps (ZeRO-3 family).
bool ShardsParams(Strategy s);
// Gradients are reduce-scattered per unit during backward (ZeRO-2 and 3).
bool ShardsGrads(Strategy s);
bool IsHybrid(Strategy s);

// The model: its family and sizes. `gpt2` is nanoGPT's GPT-2; `llama` is the
// decoder of Llama 2/3, Mistral, Qwen2 and Qwen3 as transformers writes it
// (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention), whose extra
// keys below are ignored by gpt2.
struct ModelConfig {
  std::string family = "gpt2";
  int n_layer = 6, n_head = 8, n_embd = 512;
  int vocab_size = 16384, block_size = 256;
  std::string init_from;  // a safetensors file of the engine's names (nanoGPT export)
  std::string hf_dir;     // a transformers save_pretrained directory (common/model/hf_config.h)
  // The [model] keys the job file set (so that config.json can fill the rest
  // and refuse a contradiction); not part of the model's identity.
  std::set<std::string> explicit_keys;
  // llama only.
  int n_kv_head = 0;            // key/value heads (GQA); 0 = n_head
  int intermediate_size = 0;    // SwiGLU width; required for llama
  int head_dim_override = 0;    // [model] head_dim: 0 = n_embd / n_head (Qwen3 sets its own)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool qkv_bias = false;        // Qwen2
  bool qk_norm = false;         // Qwen3: RMSNorm over each head of q and k
  bool tie_word_embeddings = false;
  std::string rope_scaling = "none";  // none | llama3
  double rope_scaling_factor = 8.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int rope_original_max_position = 8192;
  int max_position_embeddings = 0;  // from config.json (0: block_size); what an HF export declares
  // From config.json: its bos_token_id, eos_token_id and pad_token_id (those
  // it sets), as a JSON object's text ("" without hf_dir), which an HF export
  // declares again so that generate() stops where the source model did.
  std::string special_token_ids;
  bool is_llama() const { return family == "llama"; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return head_dim_override > 0 ? head_dim_override : n_embd / n_head; }
  // The lm_head is the token embedding (always for gpt2).
  bool tied() const { return !is_llama() || tie_word_embeddings; }
};
// One stream of tokens: files (each path may be a glob; a glob's matches in
// sorted order) read one after another as one stream, and optionally a loss
// mask and the document starts (packed documents) per token file
// (worker/data/token_dataset.h).
struct TokenSource {
  std::vector<std::string> paths;       // [data] path / val_path: a string or an array
  std::vector<std::string> mask_paths;  // [data] mask_path / val_mask_path
  std::vector<std::string> doc_paths;   // [data] doc_path / val_doc_path
  bool empty() const { return paths.empty(); }
};
struct DataConfig {
  DataFormat format = DataFormat::kSynthetic;
  TokenSource train;  // [data] path, mask_path, doc_path
  TokenSource val;    // [data] val_path, val_mask_path, val_doc_path
};
// How the strategies that shard gradients (shard_grad_op, full_shard and
// the hybrids) accumulate them over a step's micro-batches:
//   kSharded    each micro-batch's gradients are reduce-scattered as backward
//               produces them and added into the gradient shard, in
//               reduce_dtype: a rank never holds more than the units in
//               flight unsharded (FSDP2's default, DeepSpeed ZeRO-2/3);
//   kUnsharded  they accumulate unsharded and are reduced once, after the
//               last micro-batch: less communication, P x param bytes more
//               memory per rank (FSDP2's set_requires_gradient_sync(False)).
// The other strategies keep whole gradients anyway and reduce once.
enum class GradAccumulation { kSharded, kUnsharded };
const char* GradAccumulationName(GradAccumulation g);

// Passes over the training data after `completed_steps` global steps of
// `batch_size` sequences (1.5: the data wrapped once, half way through the
// second pass); NaN where its length is not known (synthetic data).
double EpochAt(int64_t completed_steps, int64_t batch_size, int64_t sequences_per_epoch);

struct TrainConfig {
  int steps = 200, batch_size = 32, micro_batch_size = 8;
  // [train] epochs instead of steps (> 0; never both): ResolveJobSpec sets
  // steps = ceil(epochs x sequences_per_epoch / batch_size).
  double epochs = 0;
  // Resolved, never a key: the training stream's sequences, floor((tokens -
  // 1) / block_size), where the data is on disk (0: synthetic). Step s reads
  // past s x batch_size of them: epoch s x batch_size / sequences_per_epoch.
  int64_t sequences_per_epoch = 0;
  GradAccumulation grad_accumulation = GradAccumulation::kSharded;  // [train] grad_accumulation
  // Resolved, never a key: strategy = "auto" and the file names no
  // grad_accumulation, so the coordinator weighs both modes with the
  // strategies (common/plan/strategy_choice.h) and sets grad_accumulation.
  bool auto_grad_accumulation = false;
  uint64_t seed = 1337;
  // Validation loss every eval_interval steps and after the last (0: never),
  // over the first eval_batches global batches of [data] val_path (synthetic
  // data: a synthetic stream of another seed).
  int eval_interval = 0, eval_batches = 20;
  // A worker sends a log line (loss, lr, grad norm, tokens/s) to the
  // coordinator every log_interval steps and after the last (0: only the
  // start, saves and the end); `shardctl logs` shows them.
  int log_interval = 10;
  // Steps whose global gradient norm is NaN or infinite make no update, as a
  // mixed-precision loss scaler skips them, up to this many in one run; the
  // next one fails the job naming the step. 0: the first fails it.
  int max_nonfinite_skips = 0;
};
// [optimizer] schedule: the learning rate at 0-based step s of T, warmup W.
//   kCosine    nanoGPT's: lr (s+1)/(W+1) while s < W, then a half cosine
//              from lr to min_lr over the remaining T - W steps (the default).
//   kLinear    transformers' get_linear_schedule_with_warmup: lr s/W while
//              s < W, then lr (T-s)/(T-W), here from lr down towards min_lr
//              (the same at min_lr = 0).
//   kConstant  transformers' get_constant_schedule_with_warmup: lr s/W, then
//              lr (min_lr unused).
//   kWsd       transformers' get_wsd_schedule (linear warmup, cosine decay,
//              min_lr_ratio = min_lr / lr): warmup, lr for T - W - D steps,
//              then a half cosine to min_lr over the last D = decay_steps.
enum class LrSchedule { kCosine, kLinear, kConstant, kWsd };
const char* LrScheduleName(LrSchedule s);

struct OptimizerConfig {
  double lr = 6e-4, min_lr = 6e-5;
  int warmup_steps = 20;
  LrSchedule schedule = LrSchedule::kCosine;
  int decay_steps = 0;  // kWsd only: the decay phase's length
  std::array<double, 2> betas{0.9, 0.95};
  double eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;  // grad_clip 0 disables
  // The dtypes of the weights the update reads and writes (the master) and
  // of Adam's two moments. fp32/fp32: an fp32 master (the parameters
  // themselves where param_dtype is fp32). bf16/bf16 (param_dtype bf16): no
  // master, the bf16 parameters updated in place with bf16 moments, as
  // torch.optim.AdamW does on a model loaded in bfloat16 (8 bytes a parameter
  // with bf16 gradients instead of 16). 8bit with either master:
  // bitsandbytes' AdamW8bit (worker/engine/adamw_8bit.h), on CPU devices.
  DType master_dtype = DType::kFloat32;
  MomentsDType moments_dtype = MomentsDType::kFloat32;
};
struct ParallelismConfig {
  Strategy strategy = Strategy::kFullShard;
  // strategy = "auto": the coordinator picks one for each attempt
  // (common/plan/strategy_choice.h) and the assignment carries it in the
  // resolved spec, with auto_strategy still set (its ranks then measure the
  // link for the next pick: worker/run/job_runner.cc).
  bool auto_strategy = false;
  int shard_group_size = 0;  // hybrid only; 0 means "the whole world"
  // A token embedding whose parameters are sharded (full_shard,
  // hybrid_shard, a sharded LoRA base) is looked up without being gathered:
  // each rank looks up the rows of its shard for every rank's tokens, a
  // reduce-scatter hands each rank its own, and its gradient is every rank's
  // token gradients, gathered and added into the shard. Untied it is never
  // gathered; tied, the head computes its loss over the table's shards
  // where that moves fewer bytes (worker/engine/vocab_parallel_head.h), and
  // gathers the table otherwise (worker/engine/sparse_embedding.h).
  bool sparse_embedding = false;
  // Resolved, never a key: strategy = "auto" and the file names no
  // sparse_embedding, so the coordinator weighs the table gathered and
  // sparse with the strategies (common/plan/strategy_choice.h) and sets
  // sparse_embedding.
  bool auto_sparse_embedding = false;
  // hybrid_shard: the optimizer is sharded across the replicas too. Each
  // rank of a replicate group updates 1/R of its shard (fp32 master and
  // Adam's moments held once per world, not once per replica): in backward
  // the gradient shard is reduce-scattered across the replicas instead of
  // all-reduced, and the updated pieces are all-gathered across them while
  // the next forward runs, each ahead of its unit's gather. The same bytes
  // cross the replicas' link as the all-reduce, half of them while forward
  // computes, where the all-reduce had only backward to hide behind. Units
  // the sparse embedding trains keep a replicated optimizer.
  bool shard_optimizer_across_replicas = false;
};
struct PrecisionConfig {
  DType param_dtype = DType::kFloat32, reduce_dtype = DType::kFloat32, buffer_dtype = DType::kFloat32;
  // TF32 matrix products on CUDA (faster, ~1e-3 relative error); off by
  // default so that fp32 means fp32, as in PyTorch since 1.12.
  bool allow_tf32 = false;
};
struct MemoryConfig {
  bool activation_checkpointing = false, cpu_offload = false;
  // GELU, SwiGLU and the norms computed again in backward instead of their
  // outputs kept (worker/model/recomputed_linear.h, rms_norm.h): the same
  // results bit for bit, less activation memory, one pass more each.
  bool recompute_cheap_ops = true;
};
struct PrefetchConfig {
  bool forward = true;
  BackwardPrefetch backward = BackwardPrefetch::kPre;
  int max_inflight_all_gathers = 2;
};
// LoRA (the [lora] table; PEFT's LoraConfig semantics): the base model is
// frozen and low-rank adapters are trained on the projections
// `target_modules` names, PEFT's module names: q_proj, k_proj, v_proj,
// o_proj, gate_proj, up_proj, down_proj (llama); c_attn, c_proj, c_fc
// (gpt2, where c_proj is both the attention's and the MLP's); or
// "all-linear" for every projection of the blocks. Each adapted weight W
// [out, in] gets lora_A [rank, in] and lora_B [out, rank], and computes
// x W^T + (alpha / rank) (x A^T) B^T.
enum class LoraBase { kSharded, kReplicated };
// How the frozen base is stored: in [precision] param_dtype, or (QLoRA) its
// blocks' projection matrices in NF4, 4 bits a weight in blocks of 64 with
// double-quantized scales, dequantized to param_dtype for each use (the
// norms, biases, embedding and head stay in param_dtype, as bitsandbytes'
// Linear4bit leaves them).
enum class LoraBaseDType { kParamDType, kNf4 };
struct LoraConfig {
  bool enabled = false;  // the job file has a [lora] table
  int rank = 8;          // PEFT's defaults: r = 8, lora_alpha = 8
  double alpha = 8;
  std::vector<std::string> target_modules;  // empty: the family's PEFT default
  double dropout = 0;
  // A PEFT adapter directory (adapter_config.json, adapter_model.safetensors)
  // to start from instead of PEFT's initialisation (A Kaiming-uniform, B 0).
  std::string init_from;
  // The frozen base: sharded (gathered per unit, as full_shard does) or
  // replicated (every rank holds it whole; no communication for it).
  LoraBase base = LoraBase::kSharded;
  LoraBaseDType base_dtype = LoraBaseDType::kParamDType;
  std::set<std::string> explicit_keys;
  // Not a job-file key: BaseWeightsDigest of the frozen base, filled by
  // whoever first opens it (the coordinator at submit, shardline-train at
  // start) and recorded in every checkpoint's manifest; empty: not known.
  std::string base_digest;
  double scaling() const { return alpha / rank; }
};
const char* LoraBaseName(LoraBase b);
const char* LoraBaseDTypeName(LoraBaseDType d);

struct CheckpointConfig {
  std::string dir;
  int interval = 0, keep_latest = 3;
  // Also save once this many seconds passed since the last save (0: never),
  // so that the work a failure costs is bounded in time.
  double interval_seconds = 0;
  bool async = true;
  // Save the last step when the job has trained to its end, unless that
  // step is already saved: a job that trained ends with its last step
  // committed whatever the interval (rank 0 reports done after the commit).
  bool at_end = true;
};

// How a job recovers by itself (docs/design.md, "Control plane"): when a rank is
// lost or fails with a retryable error, the job goes RESTARTING and starts
// again from its newest committed checkpoint at the largest world size in
// [min_workers, workers] it can have within restart_timeout, up to
// max_restarts times.
struct RestartConfig {
  int max_restarts = 3;
  int min_workers = 0;            // 0: the job's workers
  double restart_timeout = 300;   // seconds
};

// [job] name: shown in listings, at most this long, no control characters.
inline constexpr size_t kMaxJobNameBytes = 128;

struct JobConfig {
  std::string name = "job";
  int workers = 1;
  RestartConfig restart;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  ParallelismConfig parallelism;
  PrecisionConfig precision;
  MemoryConfig memory;
  PrefetchConfig prefetch;
  LoraConfig lora;
  CheckpointConfig checkpoint;
};

// The shard group size G actually used: world for ZeRO strategies, 1 for
// no_shard, shard_group_size (or the world) for the hybrid ones.
int ShardGroupSize(const JobConfig& c, int world_size);

}  // namespace shardline
