#include "common/plan/plan.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/ring_bytes.h"
#include "common/base/status_macros.h"
#include "common/model/nf4_layout.h"
#include "common/model/moment_blocks.h"
#include "common/model/model_shapes.h"
#include "common/model/table_shard.h"
#include "common/plan/step_schedule.h"
#include "common/spec/job_spec.h"

namespace shardline {
namespace {

constexpr Strategy kStrategies[] = {Strategy::kNoShard,     Strategy::kZero1,        Strategy::kShardGradOp,
                                    Strategy::kFullShard,   Strategy::kHybridShard, Strategy::kHybridShardZero2};

int Bytes(DType d) { return d == DType::kFloat32 ? 4 : 2; }

// Byte counts are summed in double and stored saturated: at the keys' own
// bounds (2^24 sequences of 2^20 tokens, 10^13 parameters) they pass int64,
// and a double beyond it converts to int64 as undefined behaviour.
int64_t Saturated(double bytes) {
  constexpr double kMax = 9.2e18;  // just under 2^63
  return bytes < kMax ? static_cast<int64_t>(bytes) : std::numeric_limits<int64_t>::max();
}

// The largest global batch the planner takes, as a job file's batch_size.
constexpr int64_t kMaxBatch = 1 << 24;
// The most layers, as a job file's n_layer.
constexpr int kMaxLayers = 10000;

// What every strategy's plan shares: one step's shape and its compute.
struct StepShape {
  int world = 1, b = 1;       // ranks, sequences per micro-batch
  int p = 4, r = 4;           // parameter and reduction bytes per element
  int master = 4, moments = 4;  // the optimizer's: master and each moment's bytes per element
  bool moments_8bit = false;    // (then moments is 1, for the update's time; bytes: MomentBytes)
  int micro_batches = 1;
  // Seconds of compute per micro-batch per rank: one block's, and the
  // head's (with the tied table's matmul); the token lookup counts none.
  double block_forward = 0, block_backward = 0, head_forward = 0, head_backward = 0;
  double layer_act = 0, head_act = 0, layer_input = 0;  // activation bytes
};

// The optimizer's bytes for `count` elements of `layout` from its shard 0:
// dense moments, or 8-bit ones as rank 0 holds them (MomentBlocks).
int64_t MomentBytes(const ShardLayout& layout, int64_t count, const StepShape& x) {
  if (!x.moments_8bit) return 2 * x.moments * count;
  return CutMomentBlocks(layout, 0, count).bytes();
}

// Per-rank state bytes by kind from the ownership map at the strategy's shard
// group (units padded as ShardLayout pads them): the engine's formula,
// tests/integration/formulas.py's state_bytes. Where the master's dtype is
// the parameters' (fp32, or bf16 updated in place) the master is the
// parameters' own shard or chunk (FlatParam).
void StateBytes(const std::vector<ShardLayout>& layouts, Strategy s, const StepShape& x, StrategyPlan* out) {
  const int p = x.p, r = x.r;
  const bool master_is_params = x.master == p;
  int64_t full = 0;
  for (const ShardLayout& l : layouts) full += l.padded_numel;
  const int64_t shard = full / layouts.front().group_size;
  out->params_bytes = p * (ShardsParams(s) ? shard : full);
  if (master_is_params && ShardsParams(s)) out->params_bytes = 0;  // the shard is the master itself
  out->grads_bytes = ShardsGrads(s) ? r * shard : p * full;
  if (!ShardsGrads(s) && r != p) out->grads_bytes += r * shard;
  out->master_bytes = (master_is_params && !ShardsParams(s)) ? 0 : x.master * shard;
  out->optimizer_bytes = 0;
  for (const ShardLayout& l : layouts) out->optimizer_bytes += MomentBytes(l, l.shard_numel, x);
  out->state_bytes = out->params_bytes + out->grads_bytes + out->master_bytes + out->optimizer_bytes;
}

// Bytes of one layer's saved activations at 2-byte activations; doubled in
// fp32. GPT-2: Korthikanti et al. 2022, eq. 2 (no tensor or sequence
// parallelism), 34sbh + 5as^2b, less what a block that recomputes its cheap
// ops computes again in backward (recomputed_linear.h): the GELU's output
// (8sbh) and the two layer norms' outputs (2sbh each).
double LayerActivationBytes(const ModelConfig& m, int b, int p, bool recompute_cheap_ops) {
  const double s = m.block_size, h = m.n_embd, a = m.n_head;
  const double scale = p == 4 ? 2.0 : 1.0;
  if (!m.is_llama()) return s * b * h * ((recompute_cheap_ops ? 22 : 34) + 5 * a * s / h) * scale;
  // Llama, in 2-byte units per token: norm input and q/k/v input (4h); q, and
  // k and v at the key/value width, before and after rotation (4q + 4kv);
  // the attention output (2q); the MLP's norm input and input (4h); gate and
  // up (4i), and where the cheap ops are kept silu(gate) and the product
  // (4i more) and each norm's fp32 input and normalized rows (rms_norm.h:
  // 6h, twice, in a 2-byte dtype; in fp32 the input is its own fp32 copy,
  // 2h in these units); and the softmax (2as per token).
  const double q = static_cast<double>(m.n_head) * m.head_dim(), kv = static_cast<double>(m.kv_heads()) * m.head_dim();
  const double i = m.intermediate_size;
  const double kept = recompute_cheap_ops ? 0 : 4 * i + (p == 4 ? 4 * h : 12 * h);
  return s * b * (8 * h + 6 * q + 4 * kv + 4 * i + kept + 2 * a * s) * scale;
}

// Padded sizes of the embed unit, the head unit and one block.
struct UnitSizes {
  int64_t embed = 0, head = 0, block = 0;
};
UnitSizes SizesOf(const std::vector<ShardLayout>& units) {
  return {units.front().padded_numel, units.back().padded_numel, units[1].padded_numel};
}

}  // namespace

int64_t AllocatorReserveBytes(DeviceKind device, double live_peak) {
  if (device == DeviceKind::kCuda) return Saturated(live_peak / 8);
  constexpr double kCpuProcessBytes = 138.0 * (1 << 20);
  return Saturated(kCpuProcessBytes + live_peak / 10);
}

PlanInput PlanInputForJob(const JobConfig& c, int workers) {
  PlanInput in;
  in.model = c.model;
  in.batch_size = c.train.batch_size;
  in.micro_batch_size = c.train.micro_batch_size;
  in.grad_accumulation = c.train.grad_accumulation;
  in.param_dtype = c.precision.param_dtype;
  in.reduce_dtype = c.precision.reduce_dtype;
  in.master_dtype = c.optimizer.master_dtype;
  in.moments_dtype = c.optimizer.moments_dtype;
  in.max_inflight_all_gathers = c.prefetch.max_inflight_all_gathers;
  in.shard_group_size = c.parallelism.shard_group_size;
  in.lora = c.lora;
  in.sparse_embedding = c.parallelism.sparse_embedding;
  in.recompute_cheap_ops = c.memory.recompute_cheap_ops;
  in.shard_optimizer_across_replicas = c.parallelism.shard_optimizer_across_replicas;
  in.cluster.workers = workers;
  return in;
}

namespace {

// The inputs MakePlan refuses, each in one line naming the flag.
absl::Status CheckPlanInput(const PlanInput& in) {
  const ClusterSpec& c = in.cluster;
  const ModelConfig& m = in.model;
  if (c.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  if (c.gpus_per_node < 1) return absl::InvalidArgumentError("--gpus-per-node must be at least 1");
  if (!MomentsPairWithMaster(in.moments_dtype, in.master_dtype)) {
    return absl::InvalidArgumentError("the optimizer's master and dense moments must share a dtype (--optimizer-state)");
  }
  if (in.master_dtype == DType::kBFloat16 && in.param_dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError("--optimizer-state bf16 updates bf16 parameters in place: it needs --dtype bf16");
  }
  // Written so that a NaN fails too; infinities would make every time 0.
  auto positive = [](double x) { return x > 0 && std::isfinite(x); };
  if (!positive(c.flops)) return absl::InvalidArgumentError("--flops must be positive");
  if (!positive(c.intra_node_bw) || !positive(c.inter_node_bw)) {
    return absl::InvalidArgumentError("bandwidths must be positive (--intra-bw, --inter-bw)");
  }
  if (!positive(c.memory_bw)) return absl::InvalidArgumentError("--mem-bw must be positive");
  if (!(c.comm_cpu_s_per_byte >= 0 && std::isfinite(c.comm_cpu_s_per_byte))) {
    return absl::InvalidArgumentError("--comm-cpu-per-byte must be 0 or more");
  }
  if (!positive(c.device_memory_bytes)) return absl::InvalidArgumentError("--gpu-memory must be positive");
  if (m.n_layer < 1 || m.n_embd < 1 || m.n_head < 1 || m.vocab_size < 1 || m.block_size < 1) {
    return absl::InvalidArgumentError("model: layers, hidden, heads, vocab and seq must all be positive");
  }
  // The planner builds every unit's layout: layers bounded as a job file's
  // n_layer (the parameter bound alone admits 10^9 one-wide layers).
  if (m.n_layer > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("model: layers ", m.n_layer, " is more than ", kMaxLayers,
                                                   " (--layers)"));
  }
  if (!m.is_llama() && m.n_embd % m.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model: hidden ", m.n_embd, " is not divisible by heads ",
                                                   m.n_head));
  }
  if (m.is_llama() && (m.intermediate_size < 1 || m.n_head % m.kv_heads() != 0)) {
    return absl::InvalidArgumentError("model: llama needs an intermediate size and heads divisible by kv heads");
  }
  {
    // A job's own model checks, the parameter bound among them, before
    // anything is counted or allocated from the model.
    JobConfig job;
    job.model = m;
    job.lora = in.lora;
    job.train.batch_size = job.train.micro_batch_size = 1;
    SL_RETURN_IF_ERROR(ValidateJobConfig(job, 1, "plan"));
  }
  return absl::OkStatus();
}


// What one strategy moves: the units' sizes as it trains them (t; `whole`
// keeps the untied sparse table's, which t zeroes) and the frozen base's (f,
// under LoRA), over its shard group and replicas.
struct Movement {
  Strategy s;
  int g = 1, replicas = 1;
  UnitSizes t, whole, f;
  bool lora = false, base_sharded = false;
  // [lora] base_dtype = "nf4": a block's frozen matrices in NF4 over the
  // base's group (nf4_block), its other parameters (dense_block elements,
  // padded to the group) in the param dtype.
  bool nf4 = false;
  Nf4Layout nf4_block;
  int64_t dense_block = 0;
  // A frozen block as an all-gather leaves it, in bytes.
  int64_t FrozenBlockGatheredBytes(int p) const {
    return nf4 ? p * dense_block + nf4_block.gathered_bytes() : p * f.block;
  }
  // The sparse embedding's (per micro-batch): whether it applies, to a tied
  // table, whose rows' gradients are gathered across replicas (instead of
  // the shard's all-reduce: world_rows); the bytes of its lookup, of its
  // rows' gradients over the shard group and across replicas.
  bool sparse = false, tied = false, world_rows = false;
  int64_t lookup_bytes = 0, row_grad_bytes = 0, replica_row_grad_bytes = 0;
  // The head computed over the vocabulary table's shards
  // (VocabParallelHead): the group's hidden states, targets and statistics
  // gathered before its loss, dL/dh (and untied the norm's gradient)
  // reduced after it, per micro-batch; untied, the head unit's norm
  // all-reduced from its owner, once per step. The unit holding the table
  // (tied the embed unit, untied the head) is then never gathered for the
  // head.
  bool vocab_head = false;
  // The hidden states and targets over the shard group (in flight while
  // the head's first statistics compute), then the statistics.
  int64_t head_hidden_bytes = 0;
  int64_t head_exchange_bytes = 0, head_grad_bytes = 0;
  int64_t head_prefix_bytes = 0;  // the untied head's norm: once per step, where it trains
  // Over the world (comm::HeadOverWorldBeatsAllReduce): every rank's
  // tokens, their exchanges' first stage across the replicas per micro-batch
  // (hidden states, targets, statistics; dL/dh's second), and the table's
  // parts all-gathered across them once per step instead of the holding
  // unit's shard's all-reduce (untied, and the norm's gradient all-reduced).
  bool head_world = false;
  int64_t replica_head_exchange_bytes = 0, replica_head_grad_bytes = 0, head_parts_bytes = 0;
  int64_t replica_prefix_bytes = 0;
  // The optimizer sharded across the replicas (PlanInput's): the model
  // units whose state it keeps in pieces (model::OptimizerInPieces), if any.
  std::vector<bool> piece_units;
  bool pieces = false;
};

// A shard's piece across the replicas, ceil(shard / R) elements.
int64_t PieceOf(const Movement& mv, int64_t shard) { return (shard + mv.replicas - 1) / mv.replicas; }

// The state of the units kept in pieces, as FlatParam holds it: master and
// moments [piece], the parameters and gradient shard in [R x piece]
// buffers (fp32: the master is the parameters' piece; the reduced piece
// is the gradient buffer's own).
// `trained` is model::TrainableOwnershipMap's, of the units `units`.
void PieceStateBytes(const std::vector<ShardLayout>& trained, const std::vector<int>& units, const Movement& mv,
                     const StepShape& x, StrategyPlan* sp) {
  const int p = x.p, r = x.r, mb = x.master;
  for (size_t i = 0; i < trained.size(); ++i) {
    if (!mv.piece_units[units[i]]) continue;
    const int64_t shard = trained[i].shard_numel, c = PieceOf(mv, shard), all = c * mv.replicas;
    sp->params_bytes += p * all - (mb == p ? 0 : p * shard);
    sp->master_bytes += (mb == p ? 0 : mb * c) - mb * shard;
    sp->grads_bytes += r * all - r * shard;
    sp->optimizer_bytes += MomentBytes(trained[i], c, x) - MomentBytes(trained[i], shard, x);
  }
  sp->state_bytes = sp->params_bytes + sp->grads_bytes + sp->master_bytes + sp->optimizer_bytes;
}

// The sparse embedding's rows per micro-batch: every token of every rank of
// the shard group.
int64_t SparseRows(const Movement& mv, const StepShape& x, const ModelConfig& m) {
  return int64_t{mv.g} * x.b * m.block_size;
}

// The engine's step as StepSchedule takes it: per unit, its compute, what
// it gathers (again in backward for a block), reduce-scatters and all-reduces
// across replicas; the post-optimizer gather where parameters stay whole.
ScheduleInput ScheduleOf(const PlanInput& in, const StepShape& x, const Movement& mv) {
  const ClusterSpec& c = in.cluster;
  const ModelConfig& m = in.model;
  const int g = mv.g, p = x.p, r = x.r;
  ScheduleInput sch;
  sch.micro_batches = x.micro_batches;
  sch.reduce_every_micro = ShardsGrads(mv.s) && in.grad_accumulation == GradAccumulation::kSharded;
  sch.max_inflight_gathers = in.max_inflight_all_gathers;
  sch.shard_bw = g <= c.gpus_per_node ? c.intra_node_bw : c.inter_node_bw;
  sch.replica_bw = x.world <= c.gpus_per_node ? c.intra_node_bw : c.inter_node_bw;
  sch.cpu_s_per_byte = c.comm_cpu_s_per_byte;
  const int units = model::NumUnits(m);
  for (int u = 0; u < units; ++u) {
    const bool block = u > 0 && u < units - 1;
    auto size = [&](const UnitSizes& z) { return u == 0 ? z.embed : block ? z.block : z.head; };
    UnitWork w;
    w.forward_s = u == 0 ? 0 : block ? x.block_forward : x.head_forward;
    w.backward_s = u == 0 ? 0 : block ? x.block_backward : x.head_backward;
    if (ShardsParams(mv.s)) w.gather_bytes += comm::RingAllGatherBytes(size(mv.t) * p, g);
    if (mv.base_sharded) {
      w.gather_bytes += comm::RingAllGatherBytes(block ? mv.FrozenBlockGatheredBytes(p) : size(mv.f) * p, g);
    }
    // The last block stays gathered from its forward to its backward.
    w.gather_in_backward = block && u != units - 2 && w.gather_bytes > 0;
    w.has_backward = !(mv.lora && u == 0);
    if (g > 1) w.reduce_bytes = comm::RingReduceScatterBytes(size(mv.t) * r, g);
    // The sparse table's shard is all-reduced whole, unless its rows'
    // gradients are every replica's and it is untied.
    const int64_t shard = (mv.sparse && u == 0 ? mv.whole.embed : size(mv.t)) / g;
    // (Nor is the untied head's, computed over the world.)
    const bool all_reduced = !(mv.sparse && u == 0 && mv.world_rows && (!mv.tied || mv.head_world)) &&
                             !(mv.head_world && !mv.tied && u == units - 1);
    if (mv.replicas > 1 && shard > 0 && mv.piece_units[u]) {
      const int64_t all = PieceOf(mv, shard) * mv.replicas;
      w.replica_bytes = comm::RingReduceScatterBytes(all * r, mv.replicas);
      w.replica_gather_bytes = comm::RingAllGatherBytes(all * p, mv.replicas);
    } else if (mv.replicas > 1 && shard > 0 && all_reduced) {
      w.replica_bytes = comm::RingAllReduceBytes(shard * r, r, mv.replicas);
    }
    if (mv.sparse && u == 0) {
      w.lookup_bytes = mv.lookup_bytes;
      w.row_grad_bytes = mv.row_grad_bytes;
      w.replica_row_grad_bytes = mv.replica_row_grad_bytes;
      w.replica_rows_last_only = mv.tied && !mv.head_world;
    }
    sch.units.push_back(w);
  }
  if (mv.sparse && mv.tied) {
    // The tied table is gathered with the head and reduce-scattered right
    // after the head's backward (under the vocabulary-parallel head,
    // neither: the head's exchanges are waited on, before and after its
    // compute); all-reduced then where the last rows are every replica's,
    // else after them.
    UnitWork& table = sch.units.front();
    UnitWork& head = sch.units.back();
    const double gather = std::exchange(table.gather_bytes, 0), reduce = std::exchange(table.reduce_bytes, 0);
    if (!mv.vocab_head) {
      head.gather_bytes += gather;
      head.reduce_bytes += reduce;
    }
    if (mv.world_rows) head.replica_bytes += std::exchange(table.replica_bytes, 0);
  }
  if (mv.vocab_head) {
    UnitWork& head = sch.units.back();
    if (!mv.tied) head.gather_bytes = head.reduce_bytes = 0;  // (exchanged instead)
    head.overlapped_lookup_bytes = mv.head_hidden_bytes;
    // (Over the world, the replicas' tokens of this shard rank's are here
    // once the first stage across the replicas is in: R of the head's g R
    // tokens' statistics compute while the shard group's stage runs.)
    head.overlapped_lookup_s = head.forward_s / g;
    head.lookup_bytes += mv.head_exchange_bytes;
    head.first_lookup_bytes = mv.head_prefix_bytes;
    head.row_grad_bytes += mv.head_grad_bytes;
    head.replica_lookup_bytes = mv.replica_head_exchange_bytes;
    head.replica_row_grad_bytes += mv.replica_head_grad_bytes;
    // (After the last micro-batch's head, not waited on until the end.)
    head.replica_bytes += mv.head_parts_bytes + mv.replica_prefix_bytes;
  }
  if (mv.base_sharded && m.n_layer > 0) {
    sch.first_block_frozen_bytes = comm::RingAllGatherBytes(mv.FrozenBlockGatheredBytes(p), g);
  }
  const int64_t full = mv.whole.embed + mv.whole.head + m.n_layer * mv.whole.block;
  if (!ShardsParams(mv.s) && g > 1) sch.after_step_gather_bytes = comm::RingAllGatherBytes(full * p, g);
  return sch;
}

// What strategy s trains and moves at this world size, and the bytes its
// state holds (into *sp, with its shard group and whether the sparse
// embedding applies); none when its shard group does not divide the world.
absl::StatusOr<std::optional<Movement>> MovementOf(const PlanInput& in, const StepShape& x, Strategy s,
                                                   StrategyPlan* sp) {
  const ClusterSpec& c = in.cluster;
  const ModelConfig& m = in.model;
  const int world = x.world, p = x.p, r = x.r;
  const bool lora = in.lora.enabled;
  Movement mv{s};
  int g = world;
  if (s == Strategy::kNoShard) g = 1;
  if (IsHybrid(s)) {
    g = in.shard_group_size > 0 ? in.shard_group_size : std::min(world, c.gpus_per_node);
    if (world % g != 0) return std::optional<Movement>();  // not a valid grouping at this world size
  }
  sp->shard_group = mv.g = g;
  mv.replicas = world / g;
  mv.lora = lora;
  mv.tied = m.tied();
  // What trains (every unit, or the blocks' adapters under LoRA) and, under
  // LoRA, the frozen base: sharded over the group or whole on every rank.
  SL_ASSIGN_OR_RETURN(const std::vector<ShardLayout> trained, model::TrainableOwnershipMap(m, in.lora, g));
  StateBytes(trained, s, x, sp);
  mv.t = lora ? UnitSizes{0, 0, trained.front().padded_numel} : SizesOf(trained);
  mv.whole = mv.t;  // (t's embed is zeroed below where the table is sparse)
  mv.base_sharded = lora && in.lora.base == LoraBase::kSharded && g > 1;
  if (lora) {
    SL_ASSIGN_OR_RETURN(const std::vector<ShardLayout> base, model::OwnershipMap(m, mv.base_sharded ? g : 1));
    mv.f = SizesOf(base);
    const int gb = mv.base_sharded ? g : 1;
    int64_t block_bytes = p * mv.f.block / gb;
    if (in.lora.base_dtype == LoraBaseDType::kNf4 && m.n_layer > 0) {
      // (Nf4Base's layout, and the dense rest's FlatParam.)
      mv.nf4 = true;
      const Nf4Split split = SplitNf4Matrices(model::UnitParams(m, 1));
      std::vector<int64_t> matrices;
      int64_t dense = 0;
      for (const ParamSpec& q : split.matrices) matrices.push_back(q.numel());
      for (const ParamSpec& q : split.dense) dense += q.numel();
      mv.nf4_block = MakeNf4Layout(matrices, gb);
      mv.dense_block = (dense + gb - 1) / gb * gb;
      block_bytes = p * mv.dense_block / gb + mv.nf4_block.resident_bytes();
    }
    const int64_t frozen = p * (mv.f.embed + mv.f.head) / gb + m.n_layer * block_bytes;
    sp->params_bytes += frozen;
    sp->state_bytes += frozen;
  }
  // The sparse embedding: a micro-batch moves its tokens' ids (and GPT-2's
  // positions), partial rows (param dtype) and rows' gradients (reduce
  // dtype), those across replicas too where they are fewer bytes than the
  // table shard's all-reduce (comm::RowsGatherBeatsAllReduce). Untied,
  // the table is never whole.
  mv.sparse = in.sparse_embedding && g > 1 && (lora ? mv.base_sharded : ShardsParams(s));
  sp->sparse_embedding = mv.sparse;
  ParallelismConfig par;
  par.strategy = s;
  par.sparse_embedding = in.sparse_embedding;
  par.shard_optimizer_across_replicas = in.shard_optimizer_across_replicas;
  for (int u = 0; u < model::NumUnits(m); ++u) {
    mv.piece_units.push_back(model::OptimizerInPieces(par, m, g, mv.replicas, u));
    mv.pieces = mv.pieces || mv.piece_units.back();
  }
  if (mv.pieces) PieceStateBytes(trained, model::TrainableUnits(m, in.lora), mv, x, sp);
  if (!mv.sparse) return std::optional<Movement>(mv);
  // Every parameter of the embed unit is a table looked up (SparseEmbedding's).
  const int64_t tables = static_cast<int64_t>(model::UnitParams(m, 0).size());
  const int64_t C = m.n_embd, rows = SparseRows(mv, x, m);
  const int64_t table_shard = (lora ? mv.f : mv.t).embed / g;
  mv.world_rows = !lora && mv.replicas > 1 && comm::RowsGatherBeatsAllReduce(rows * C, table_shard, mv.replicas);
  mv.lookup_bytes = comm::RingAllGatherBytes(rows * 8 * tables, g) + comm::RingReduceScatterBytes(rows * C * p, g);
  if (!lora) mv.row_grad_bytes = comm::RingAllGatherBytes(rows * C * r, g);
  if (mv.world_rows) {
    mv.replica_row_grad_bytes = comm::RingAllGatherBytes(mv.replicas * rows * (C * r + 8 * tables), mv.replicas);
  }
  if (!mv.tied) (lora ? mv.f : mv.t).embed = 0;  // neither held, gathered nor reduce-scattered
  // Tied, the head's loss over the vocabulary where that moves fewer bytes
  // than the table (comm::VocabParallelBeatsGather, as the engine decides):
  // hidden states (param dtype) and targets gathered while a rank's own
  // tokens' statistics compute, then [rows, 2 + cut rows] fp32 statistics
  // gathered, dL/dh (reduce dtype) reduce-scattered.
  // Untied, the head unit's norm (C) is all-reduced instead of gathering
  // the unit (once per step: it changes only with the optimizer), and its
  // gradient likewise (every micro-batch) where it trains.
  const UnitSizes& base = lora ? mv.f : mv.whole;
  const int64_t holder = mv.tied ? base.embed : base.head;
  mv.vocab_head = comm::VocabParallelBeatsGather(rows, C, holder, p, r, lora ? 0 : r);
  if (mv.vocab_head) {
    SL_ASSIGN_OR_RETURN(const std::vector<ShardLayout> units, model::OwnershipMap(m, g));
    const ShardLayout& unit = mv.tied ? units.front() : units.back();
    const int table = mv.tied ? 0 : static_cast<int>(unit.params.size()) - 1;
    // Over the world (trained; tied, the rows' gradients across the
    // replicas already): R times the tokens, each exchange across the
    // replicas first (dL/dh's last), and the parts' all-gather.
    const int64_t own = int64_t{x.b} * m.block_size;  // a rank's tokens per micro-batch
    const int64_t holder_shard = holder / g;
    mv.head_world = !lora && mv.replicas > 1 && (!mv.tied || mv.world_rows) &&
                    comm::HeadOverWorldBeatsAllReduce(own * x.micro_batches, C, holder_shard, p, r, mv.replicas);
    const int R = mv.head_world ? mv.replicas : 1;
    const int64_t head_rows = R * rows;
    const int64_t stats = 2 + static_cast<int64_t>(TableShard::CutRows(unit, table, R).size());
    mv.head_hidden_bytes = comm::RingAllGatherBytes(head_rows * C * p, g) + comm::RingAllGatherBytes(head_rows * 8, g);
    mv.head_exchange_bytes = comm::RingAllGatherBytes(g * R * head_rows * stats * 4, g);
    mv.head_grad_bytes = comm::RingReduceScatterBytes(head_rows * C * r, g);
    if (mv.head_world) {
      mv.replica_head_exchange_bytes = comm::RingAllGatherBytes(R * own * C * p, R) +
                                       comm::RingAllGatherBytes(R * own * 8, R) +
                                       comm::RingAllGatherBytes(R * head_rows * stats * 4, R);
      mv.replica_head_grad_bytes = comm::RingReduceScatterBytes(R * own * C * r, R);
      mv.head_parts_bytes = comm::RingAllGatherBytes(R * ((holder_shard + R - 1) / R) * r, R);
      if (!mv.tied) mv.replica_prefix_bytes = comm::RingAllReduceBytes(C * r, r, R);
    }
    // (A frozen norm is summed once per job: no bytes per step.)
    if (!mv.tied && !lora) {
      mv.head_prefix_bytes = comm::RingAllReduceBytes(C * p, p, g);
      mv.head_grad_bytes += comm::RingAllReduceBytes(C * r, r, g);
    }
  }
  return std::optional<Movement>(mv);
}

// A strategy's memory per rank beyond its state: the units and gradients
// unsharded at once, the sparse embedding's rows, and activations (with and
// without checkpointing), and whether they fit.
void PlanMemory(const PlanInput& in, const StepShape& x, const Movement& mv, StrategyPlan* sp) {
  const ModelConfig& m = in.model;
  const int p = x.p, r = x.r;
  const UnitSizes& t = mv.t;
  if (mv.sparse) sp->transient_bytes += SparseRows(mv, x, m) * m.n_embd * (p + (mv.world_rows ? mv.replicas : 1) * r);
  // The vocabulary-parallel head holds the group's hidden states, dL/dh in
  // fp32 and the reduce dtype, and a table shard's fp32 gradient instead of
  // the whole table and its gradient.
  const UnitSizes& base = mv.lora ? mv.f : t;
  const int64_t table = mv.vocab_head ? (mv.tied ? base.embed : base.head) : 0;  // (the unit holding it)
  // (Over the world: every rank's tokens, and the part's gradient beside
  // the gathered parts.)
  if (mv.vocab_head) {
    const int R = mv.head_world ? mv.replicas : 1;
    sp->transient_bytes += R * SparseRows(mv, x, m) * m.n_embd * (p + 4 + r) + 4 * table / mv.g +
                           (mv.head_world ? 4 * table / mv.g / R : 0);
  }
  const int live_blocks = std::min(m.n_layer, 1 + in.max_inflight_all_gathers);
  if (ShardsParams(mv.s)) sp->transient_bytes += p * (t.embed + t.head + live_blocks * t.block);
  if (mv.base_sharded) {
    sp->transient_bytes += p * (mv.f.embed + mv.f.head) + live_blocks * mv.FrozenBlockGatheredBytes(p);
  }
  // An NF4 block in use holds its matrices dequantized (one block at a time:
  // each is resharded before the next is waited for).
  if (mv.nf4) sp->transient_bytes += p * mv.nf4_block.numel;
  sp->transient_bytes -= p * table;  // (counted just above, and never gathered)
  // Unsharded gradients: under sharded accumulation (or one micro-batch)
  // the unit in compute and the one being reduced (two blocks, or the head
  // and the last block); under unsharded
  // accumulation every unit's, held across the micro-batches.
  const bool hold_grads =
      ShardsGrads(mv.s) && x.micro_batches > 1 && in.grad_accumulation == GradAccumulation::kUnsharded;
  // (The vocabulary-parallel head's gradient of the table's unit is its
  // shard, counted above.)
  const int64_t table_grad = mv.lora ? 0 : table;
  if (hold_grads) {
    sp->transient_bytes += p * (t.embed + t.head + m.n_layer * t.block - table_grad);
  } else if (ShardsGrads(mv.s)) {
    // The head's gradient and the last block's together where the head is
    // the larger unit (an untied lm_head); the exchanged head's is the norm's.
    const int64_t head_grad = mv.vocab_head && !mv.tied ? t.head - table_grad : t.head;
    sp->transient_bytes += p * (t.embed - (mv.tied ? table_grad : 0) + t.block + std::max(t.block, head_grad));
  }
  // A gathered head that trains its table computes the table's gradient in
  // its forward (LinearCrossEntropy: fp32 [V, C]) and keeps it for its
  // backward, with every activation.
  const double head_act =
      x.head_act + (mv.vocab_head || mv.lora ? 0 : 4.0 * static_cast<double>(m.vocab_size) * m.n_embd);
  const double acts = m.n_layer * x.layer_act + head_act;
  const double acts_checkpointed = m.n_layer * x.layer_input + x.layer_act + head_act;
  const double held = static_cast<double>(sp->state_bytes) + static_cast<double>(sp->transient_bytes);
  sp->activation_bytes = Saturated(acts);
  sp->activation_bytes_checkpointed = Saturated(acts_checkpointed);
  sp->peak_bytes = Saturated(held + acts);
  sp->peak_bytes_checkpointed = Saturated(held + acts_checkpointed);
  sp->reserve_bytes = AllocatorReserveBytes(in.cluster.device, held + acts);
  sp->reserve_bytes_checkpointed = AllocatorReserveBytes(in.cluster.device, held + acts_checkpointed);
  const double memory = in.cluster.device_memory_bytes;
  sp->fits = held + acts + static_cast<double>(sp->reserve_bytes) <= memory;
  sp->fits_checkpointed = held + acts_checkpointed + static_cast<double>(sp->reserve_bytes_checkpointed) <= memory;
}

// A strategy's communication and step time per rank: the engine's
// collectives, unit by unit, as it issues them (step_schedule.h), and the
// optimizer's update.
void PlanTime(const PlanInput& in, const StepShape& x, const Movement& mv, int64_t tokens_per_step,
              StrategyPlan* sp) {
  const ModelConfig& m = in.model;
  ScheduleInput sch = ScheduleOf(in, x, mv);
  const int64_t full_p = mv.whole.embed + mv.whole.head + m.n_layer * mv.whole.block;
  // AdamW reads and writes master, m, v, reads the gradient, writes the parameter.
  int64_t owned = ShardsGrads(mv.s) || mv.s == Strategy::kZero1 ? full_p / mv.g : full_p;
  for (int u = 0; u < model::NumUnits(m); ++u) {
    if (!mv.piece_units[u]) continue;
    const bool block = u > 0 && u < model::NumUnits(m) - 1;
    const int64_t shard = (u == 0 ? mv.t.embed : block ? mv.t.block : mv.t.head) / mv.g;
    owned -= shard - PieceOf(mv, shard);
  }
  sp->optimizer_s = owned * (2 * (x.master + 2 * x.moments) + x.r + x.p) / in.cluster.memory_bw;
  sch.carried_gather_s = sp->optimizer_s;  // (a step of a job's steady state)
  const ScheduleTimes times = SimulateStep(sch);
  sp->comm_bytes = Saturated(times.bytes);
  sp->comm_s = times.comm_s;
  sp->compute_s = times.compute_s;
  sp->exposed_comm_s = times.step_s - times.compute_s;
  sp->step_s = times.step_s + sp->optimizer_s;
  // Checkpointing: every block's forward again before its backward.
  for (size_t u = 1; u + 1 < sch.units.size(); ++u) sch.units[u].backward_s += sch.units[u].forward_s;
  sp->step_s_checkpointed = SimulateStep(sch).step_s + sp->optimizer_s;
  sp->tokens_per_second = tokens_per_step / sp->step_s;
}

// One strategy's memory, communication and step time; none when its shard
// group does not divide the world.
absl::StatusOr<std::optional<StrategyPlan>> PlanStrategy(const PlanInput& in, const StepShape& x, Strategy s,
                                                         int64_t tokens_per_step) {
  StrategyPlan sp;
  sp.strategy = s;
  SL_ASSIGN_OR_RETURN(const std::optional<Movement> mv, MovementOf(in, x, s, &sp));
  if (!mv) return std::optional<StrategyPlan>();
  PlanMemory(in, x, *mv, &sp);
  PlanTime(in, x, *mv, tokens_per_step, &sp);
  return std::optional<StrategyPlan>(sp);
}

// The fastest that fits; checkpointing only if nothing fits without it.
void Recommend(Plan* plan_ptr) {
  Plan& plan = *plan_ptr;
  for (bool ckpt : {false, true}) {
    double best = 1e300;
    for (const auto& sp : plan.strategies) {
      const bool fits = ckpt ? sp.fits_checkpointed : sp.fits;
      const double t = ckpt ? sp.step_s_checkpointed : sp.step_s;
      if (fits && t < best) {
        best = t;
        plan.recommended = StrategyName(sp.strategy);
        plan.recommended_checkpointing = ckpt;
      }
    }
    if (!plan.recommended.empty()) break;
  }
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const PlanInput& in) {
  SL_RETURN_IF_ERROR(CheckPlanInput(in));
  const ClusterSpec& c = in.cluster;
  const ModelConfig& m = in.model;
  const int world = c.workers;
  const int b = std::max(1, in.micro_batch_size);
  const int64_t per_step = static_cast<int64_t>(b) * world;  // int64: both may be large
  const int64_t batch = in.batch_size > 0 ? in.batch_size : per_step;
  if (batch > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size ", batch, " is more than ", kMaxBatch,
                                                   " sequences (--batch, or --micro-batch x --workers)"));
  }
  if (batch % per_step != 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size ", batch, " is not a multiple of micro_batch_size ",
                                                   b, " x ", world, " workers"));
  }
  const int p = Bytes(in.param_dtype), r = Bytes(in.reduce_dtype);
  Plan plan;
  plan.params = model::NumParams(m);
  plan.trainable_params = in.lora.enabled ? model::NumAdapterParams(m, in.lora) : plan.params;
  plan.flops_per_token = model::TrainingFlopsPerToken(m, in.lora);
  plan.tokens_per_step = batch * m.block_size;
  plan.micro_batches = static_cast<int>(batch / per_step);
  // Per token: a block's (model::BlockFlopsPerToken); the head's share is
  // the rest of model::TrainingFlopsPerToken, split as a block's is.
  const bool lora = in.lora.enabled;
  const model::BlockFlops block = model::BlockFlopsPerToken(m, in.lora);
  const double head = plan.flops_per_token - m.n_layer * (block.forward + block.backward);
  const double head_forward = lora ? head / 2 : head / 3;
  const double seconds_per_flop = static_cast<double>(b) * m.block_size / c.flops;  // one micro-batch's tokens'

  const double layer_act = LayerActivationBytes(m, b, p, in.recompute_cheap_ops);
  const double head_act = 2.0 * b * m.block_size * m.vocab_size * 4;  // fp32 logits and their gradient
  const double layer_input = static_cast<double>(b) * m.block_size * m.n_embd * (p == 4 ? 4 : 2);

  StepShape x;
  x.world = world, x.b = b, x.p = p, x.r = r, x.micro_batches = plan.micro_batches;
  x.master = Bytes(in.master_dtype);
  x.moments_8bit = in.moments_dtype == MomentsDType::kDynamic8Bit;
  x.moments = x.moments_8bit ? 1 : in.moments_dtype == MomentsDType::kFloat32 ? 4 : 2;
  x.block_forward = block.forward * seconds_per_flop, x.block_backward = block.backward * seconds_per_flop;
  x.head_forward = head_forward * seconds_per_flop, x.head_backward = (head - head_forward) * seconds_per_flop;
  x.layer_act = layer_act, x.head_act = head_act, x.layer_input = layer_input;
  for (Strategy s : kStrategies) {
    SL_ASSIGN_OR_RETURN(std::optional<StrategyPlan> sp, PlanStrategy(in, x, s, plan.tokens_per_step));
    if (sp) plan.strategies.push_back(*sp);
  }
  Recommend(&plan);
  return plan;
}

}  // namespace shardline
