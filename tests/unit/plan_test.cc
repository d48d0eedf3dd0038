// The planner's arithmetic: docs/design.md's state table, the ring bytes, the
// choice of strategy, and errors naming the flag.
#include "common/plan/plan.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "common/base/ring_bytes.h"
#include "common/model/model_shapes.h"
#include "common/model/table_shard.h"

namespace shardline {
namespace {

const StrategyPlan& Of(const Plan& p, Strategy s) {
  for (const auto& sp : p.strategies) {
    if (sp.strategy == s) return sp;
  }
  static StrategyPlan none;
  ADD_FAILURE() << "no plan for " << StrategyName(s);
  return none;
}

PlanInput Gpt2Small(int workers) {
  PlanInput in;
  in.model = ModelConfig{"gpt2", 12, 12, 768, 50304, 1024, ""};
  in.cluster.workers = workers;
  in.micro_batch_size = 4;
  in.param_dtype = DType::kBFloat16;
  in.reduce_dtype = DType::kBFloat16;
  return in;
}

TEST(Plan, StateBytesFollowDesignsTable) {
  // 8 ranks and a model whose units all divide by 8: no padding, so the
  // table's formulas hold exactly (bf16 params and grads).
  auto plan = MakePlan(Gpt2Small(8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double P = static_cast<double>(plan->params), N = 8;
  EXPECT_DOUBLE_EQ(Of(*plan, Strategy::kNoShard).state_bytes, 16 * P);
  EXPECT_DOUBLE_EQ(Of(*plan, Strategy::kZero1).state_bytes, 4 * P + 12 * P / N);
  EXPECT_DOUBLE_EQ(Of(*plan, Strategy::kShardGradOp).state_bytes, 2 * P + 14 * P / N);
  EXPECT_DOUBLE_EQ(Of(*plan, Strategy::kFullShard).state_bytes, 16 * P / N);
  EXPECT_EQ(Of(*plan, Strategy::kHybridShard).shard_group, 8);  // gpus_per_node
}

TEST(Plan, OptimizerAcrossReplicasHoldsAPieceAndMovesTheAllReducesBytes) {
  // GPT-2 small on 16 ranks, 2 nodes of 8: hybrid_shard's 2 replicas each
  // keep half of every shard's master and moments (bf16 parameters: the
  // master is separate), and send what the all-reduce sent, as a
  // reduce-scatter of the gradient (bf16) and a gather of the parameters
  // (bf16).
  PlanInput in = Gpt2Small(16);
  auto whole = MakePlan(in);
  in.shard_optimizer_across_replicas = true;
  auto pieces = MakePlan(in);
  ASSERT_TRUE(whole.ok() && pieces.ok());
  const StrategyPlan &a = Of(*whole, Strategy::kHybridShard), &b = Of(*pieces, Strategy::kHybridShard);
  const double P = static_cast<double>(whole->params), N = 16;
  const double pad = 16.0 * 16 * model::NumUnits(in.model);  // (each unit's piece rounds up)
  EXPECT_NEAR(a.master_bytes + a.optimizer_bytes, 12 * P / 8, pad);
  EXPECT_NEAR(b.master_bytes + b.optimizer_bytes, 12 * P / N, pad);
  EXPECT_NEAR(b.grads_bytes, a.grads_bytes, pad);  // (the piece is reduced in place)
  EXPECT_EQ(b.params_bytes, a.params_bytes);                   // (a group's shards divide by 2)
  EXPECT_NEAR(static_cast<double>(b.comm_bytes), static_cast<double>(a.comm_bytes), pad);
  // Other strategies do not change.
  EXPECT_EQ(Of(*pieces, Strategy::kFullShard).state_bytes, Of(*whole, Strategy::kFullShard).state_bytes);
}

// The table says its unit (GiB, 2^30) once, rather than a "G" after each
// figure that reads as the decimal GB --gpu-memory takes.
TEST(Plan, TheTableNamesItsUnits) {
  auto plan = MakePlan(Gpt2Small(8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string t = PlanTable(*plan);
  EXPECT_NE(t.find("in GiB, 2^30 bytes"), std::string::npos) << t;
  EXPECT_EQ(t.find("G "), std::string::npos) << t;
  const double gib = Of(*plan, Strategy::kFullShard).state_bytes / (1024.0 * 1024 * 1024);
  char figure[32];
  std::snprintf(figure, sizeof figure, " %.2f ", gib);
  EXPECT_NE(t.find(figure), std::string::npos) << figure << " in\n" << t;
}

TEST(Plan, CommunicationIsTheRingBytes) {
  PlanInput in = Gpt2Small(4);
  in.batch_size = 16;  // one micro-batch per rank
  auto plan = MakePlan(in);
  ASSERT_TRUE(plan.ok());
  const double P = static_cast<double>(plan->params), N = 4;
  // no_shard: an all-reduce of bf16 grads, 2(N-1)/N of them.
  EXPECT_NEAR(Of(*plan, Strategy::kNoShard).comm_bytes, 2 * (N - 1) / N * 2 * P, 64);
  // full_shard: gathers every unit in forward and the blocks again in
  // backward but the last (kept from its forward to its backward), then
  // reduce-scatters every gradient: (N-1)/N of each, bf16.
  auto numel = [&](int unit) {
    int64_t n = 0;
    for (const auto& s : model::UnitParams(in.model, unit)) n += s.numel();
    return static_cast<double>(n);
  };
  const double embed = numel(0), head = numel(13), blocks = 12 * numel(1);
  const double gathered = embed + head + 2 * blocks - numel(12);
  EXPECT_NEAR(Of(*plan, Strategy::kFullShard).comm_bytes, (N - 1) / N * 2 * (gathered + P), 64);
}

TEST(Plan, SevenBillionOnEightH100sShardsAndRecommendsTheFastestThatFits) {
  PlanInput in;
  in.model = ModelForParams(7e9, 32000, 4096);
  in.cluster.workers = 8;
  in.cluster.gpus_per_node = 8;
  in.cluster.device_memory_bytes = 80e9;
  in.micro_batch_size = 1;
  auto plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(static_cast<double>(plan->params), 7e9, 0.005 * 7e9);
  EXPECT_FALSE(Of(*plan, Strategy::kNoShard).fits) << "16 bytes x 7e9 parameters is 112 GB";
  EXPECT_TRUE(Of(*plan, Strategy::kFullShard).fits_checkpointed);
  ASSERT_FALSE(plan->recommended.empty());
  const StrategyPlan* best = nullptr;
  for (const auto& sp : plan->strategies) {
    if (StrategyName(sp.strategy) == plan->recommended) best = &sp;
  }
  ASSERT_NE(best, nullptr);
  for (const auto& sp : plan->strategies) {
    const bool fits = plan->recommended_checkpointing ? sp.fits_checkpointed : sp.fits;
    const double t = plan->recommended_checkpointing ? sp.step_s_checkpointed : sp.step_s;
    const double bt = plan->recommended_checkpointing ? best->step_s_checkpointed : best->step_s;
    if (fits) EXPECT_LE(bt, t) << StrategyName(sp.strategy) << " fits and is faster";
  }
}

TEST(Plan, ParamsGivesThatManyParametersInEitherFamily) {
  for (const char* family : {"gpt2", "llama"}) {
    for (double n : {1.24e8, 1e9, 7e9, 7e10}) {
      const ModelConfig m = ModelForParams(n, 128256, 4096, family);
      const double got = static_cast<double>(model::NumParams(m));
      EXPECT_NEAR(got, n, 0.005 * n) << family << " " << n << ": " << m.n_layer << " x " << m.n_embd;
      EXPECT_EQ(m.family, family);
    }
  }
  // Llama-shaped: GQA 4:1, SwiGLU near 8/3 hidden, an untied head (Llama 2 7B's shape).
  const ModelConfig m = ModelForParams(7e9, 32000, 4096, "llama");
  EXPECT_EQ(m.n_head, 4 * m.kv_heads());
  EXPECT_NEAR(m.intermediate_size, 8.0 * m.n_embd / 3, 3 * 256 + 128);
  EXPECT_FALSE(m.tied());
}

// A 1B llama at N=8 with bf16 parameters and bf16 reduction.
PlanInput Llama1BOnEight() {
  PlanInput in;
  in.model = ModelForParams(1e9, 32000, 2048, "llama");
  in.cluster.workers = 8;
  in.param_dtype = DType::kBFloat16;
  in.reduce_dtype = DType::kBFloat16;
  return in;
}

TEST(Plan, LlamaWithBf16ReductionHoldsSixteenBytesPerParameter) {
  const PlanInput in = Llama1BOnEight();
  auto plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double P = static_cast<double>(plan->params);
  // Padding to the group of 8 adds at most 7 elements per unit.
  const double pad = 16.0 * 7 * model::NumUnits(in.model);
  EXPECT_NEAR(Of(*plan, Strategy::kNoShard).state_bytes, 16 * P, pad);
  EXPECT_NEAR(Of(*plan, Strategy::kFullShard).state_bytes, 16 * P / 8, pad);
  // Activations: per layer and token, norm inputs and projections' inputs
  // (8h), q (and rotated q) and the attention output (6q), k and v at the kv
  // width before and after rotation (4kv), SwiGLU's two intermediate-wide
  // inputs (4i) and the softmax (2as), in bytes at bf16; then the logits
  // and their gradient (fp32), and lm_head's gradient, which the fused loss
  // computes in forward (fp32).
  const ModelConfig& m = in.model;
  const double sb = 2048.0 * in.micro_batch_size, h = m.n_embd, q = m.n_head * m.head_dim(),
               kv = m.kv_heads() * m.head_dim(), i = m.intermediate_size;
  const double layer = sb * (8 * h + 6 * q + 4 * kv + 4 * i + 2 * m.n_head * 2048.0);
  EXPECT_DOUBLE_EQ(Of(*plan, Strategy::kFullShard).activation_bytes,
                   std::floor(m.n_layer * layer + 2.0 * sb * m.vocab_size * 4 + 4.0 * m.vocab_size * h));
}

// [optimizer] master_dtype = moments_dtype = "bf16": no master, 2-byte
// moments; with bf16 parameters and reduction, 8 bytes a parameter.
TEST(Plan, Bf16OptimizerStateHoldsEightBytesPerParameter) {
  PlanInput in = Llama1BOnEight();
  in.master_dtype = DType::kBFloat16;
  in.moments_dtype = MomentsDType::kBFloat16;
  auto plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double P = static_cast<double>(plan->params);
  const double pad = 8.0 * 7 * model::NumUnits(in.model);
  for (Strategy s : {Strategy::kNoShard, Strategy::kFullShard}) {
    const StrategyPlan& sp = Of(*plan, s);
    EXPECT_NEAR(sp.state_bytes, 8 * P / (s == Strategy::kNoShard ? 1 : 8), pad) << StrategyName(s);
    EXPECT_NEAR(sp.optimizer_bytes, 4 * P / (s == Strategy::kNoShard ? 1 : 8), pad) << StrategyName(s);
  }
  EXPECT_EQ(Of(*plan, Strategy::kNoShard).master_bytes, 0);  // the parameters are the master
  EXPECT_EQ(Of(*plan, Strategy::kFullShard).params_bytes, 0);  // the shard is the master
  in.param_dtype = in.reduce_dtype = DType::kFloat32;
  EXPECT_EQ(MakePlan(in).status().message(),
            "--optimizer-state bf16 updates bf16 parameters in place: it needs --dtype bf16");
}

// [optimizer] moments_dtype = "8bit": a byte a moment and an fp32 scale a
// block of 256 for every tensor of 4096 elements or more (a Llama's are all
// but its norms, whose fp32 moments are under 0.1% of the elements here).
TEST(Plan, EightBitMomentsHoldAboutTwoBytesPerParameter) {
  PlanInput in = Llama1BOnEight();
  in.moments_dtype = MomentsDType::kDynamic8Bit;
  auto plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double P = static_cast<double>(plan->params);
  const StrategyPlan& sp = Of(*plan, Strategy::kFullShard);
  EXPECT_GE(sp.optimizer_bytes, (2 + 8.0 / 256) * P / 8);
  EXPECT_LE(sp.optimizer_bytes, (2 + 8.0 / 256) * P / 8 * 1.001 + 2 * 8 * 2 * 256 * model::NumUnits(in.model));
  EXPECT_EQ(sp.master_bytes, 4 * sp.grads_bytes / 2);  // the fp32 master beside bf16 gradients
}

TEST(Plan, LoraHoldsTheFrozenBaseAndTheAdaptersState) {
  // A 1B llama at N=8 with rank-16 adapters on every projection: the base in
  // bf16, sharded over the group or whole, plus the strategy's state for the
  // adapters alone; only adapter gradients are reduced, and the frozen base
  // costs 4 FLOPs per weight and token instead of 6.
  PlanInput in = Llama1BOnEight();
  in.lora.enabled = true;
  in.lora.rank = 16;
  in.lora.target_modules = {"all-linear"};
  const double P = static_cast<double>(model::NumParams(in.model));
  const double A = static_cast<double>(model::NumAdapterParams(in.model, in.lora));
  const double pad = 16.0 * 7 * 2 * model::NumUnits(in.model);
  for (LoraBase base : {LoraBase::kSharded, LoraBase::kReplicated}) {
    in.lora.base = base;
    auto plan = MakePlan(in);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->trainable_params, static_cast<int64_t>(A));
    const double frozen = base == LoraBase::kSharded ? 2 * P / 8 : 2 * P;
    EXPECT_NEAR(Of(*plan, Strategy::kFullShard).state_bytes, frozen + 16 * A / 8, pad);
    EXPECT_NEAR(Of(*plan, Strategy::kNoShard).state_bytes, 2 * P + 16 * A, pad);  // a group of one holds it all
    EXPECT_NEAR(Of(*plan, Strategy::kFullShard).grads_bytes, 2 * A / 8, pad);
  }
  const ModelConfig& m = in.model;
  const double attention = 12.0 * m.n_layer * m.n_head * m.head_dim() * m.block_size;
  const double matmul = P - static_cast<double>(m.vocab_size) * m.n_embd;  // less the (untied) lookup
  EXPECT_DOUBLE_EQ(model::TrainingFlopsPerToken(m, in.lora), 4 * matmul + 6 * A + attention);
  // A replicated base never moves; a sharded one is gathered per use.
  in.lora.base = LoraBase::kReplicated;
  const int64_t replicated = Of(*MakePlan(in), Strategy::kFullShard).comm_bytes;
  in.lora.base = LoraBase::kSharded;
  const int64_t sharded = Of(*MakePlan(in), Strategy::kFullShard).comm_bytes;
  EXPECT_GT(sharded, 2 * P * 7 / 8 * 2 * 0.9);  // forward and backward gathers of the bf16 base
  EXPECT_LT(replicated, 2 * A * 4);
}

TEST(Plan, BadInputsNameTheFlag) {
  PlanInput in = Gpt2Small(0);
  EXPECT_NE(std::string(MakePlan(in).status().message()).find("--workers"), std::string::npos);
  in = Gpt2Small(4);
  in.model.n_head = 5;
  EXPECT_NE(std::string(MakePlan(in).status().message()).find("heads 5"), std::string::npos);
  in = Gpt2Small(4);
  in.batch_size = 6;
  EXPECT_NE(std::string(MakePlan(in).status().message()).find("batch_size 6"), std::string::npos);
}

TEST(Plan, ModelsBeyondAJobsBoundsAreRefusedBeforeAnythingIsCounted) {
  // 10^8 layers once kept `shardctl plan` counting (and allocating) forever.
  PlanInput in = Gpt2Small(4);
  in.model.n_layer = 100000000;
  EXPECT_EQ(MakePlan(in).status().message(), "model: layers 100000000 is more than 10000 (--layers)");
  // Each size within a job file's bound, the product past the parameter limit.
  in = Gpt2Small(4);
  in.model.n_layer = 10000;
  in.model.n_embd = 1 << 20;
  in.model.n_head = 1;
  EXPECT_NE(std::string(MakePlan(in).status().message()).find("more than the limit of 1e+13"), std::string::npos);
  // Past int64 altogether (llama's attention widths): refused, not wrapped.
  in.model = ModelConfig{};
  in.model.family = "llama";
  in.model.n_layer = 10000;
  in.model.n_head = 65536;
  in.model.n_embd = 1 << 20;
  in.model.head_dim_override = 65536;
  in.model.intermediate_size = 1;
  EXPECT_NE(std::string(MakePlan(in).status().message()).find("1.8e+20 parameters"), std::string::npos)
      << MakePlan(in).status();
  // Rates that are not positive numbers name their flag (a NaN too).
  in = Gpt2Small(4);
  in.cluster.memory_bw = std::nan("");
  EXPECT_NE(std::string(MakePlan(in).status().message()).find("--mem-bw"), std::string::npos);
  in = Gpt2Small(4);
  in.cluster.device_memory_bytes = 0;
  EXPECT_NE(std::string(MakePlan(in).status().message()).find("--gpu-memory"), std::string::npos);
  in = Gpt2Small(4);
  in.batch_size = 1 << 25;
  EXPECT_NE(std::string(MakePlan(in).status().message()).find("batch_size 33554432 is more than 16777216"),
            std::string::npos);
}

TEST(Plan, BytesAtTheBoundsSaturateInsteadOfWrapping) {
  // 10^13 fp32 parameters, 2^20-token sequences and 2^24 sequences in 2^20
  // micro-batches of 8: activations and gathered bytes pass int64 and are
  // reported as its largest value (never negative), and nothing fits.
  PlanInput in;
  in.model = ModelForParams(9e12, 50304, 1 << 20, "gpt2");
  in.cluster.workers = 2;
  in.batch_size = 1 << 24;
  in.micro_batch_size = 8;
  in.param_dtype = DType::kFloat32;
  auto plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const StrategyPlan& sp : plan->strategies) {
    EXPECT_EQ(sp.activation_bytes, std::numeric_limits<int64_t>::max()) << StrategyName(sp.strategy);
    EXPECT_EQ(sp.peak_bytes, std::numeric_limits<int64_t>::max());
    EXPECT_GT(sp.comm_bytes, 0);
    EXPECT_FALSE(sp.fits || sp.fits_checkpointed);
  }
  EXPECT_EQ(Of(*plan, Strategy::kFullShard).comm_bytes, std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(plan->recommended.empty());
  // A count no shape reaches still gives a model (the closest), without
  // converting an out-of-range layer count.
  for (double n : {1e300, std::nan("")}) EXPECT_GE(ModelForParams(n, 50304, 1024).n_layer, 1);
}

// Gradient accumulation over micro-batches (issue 26): sharded accumulation
// keeps memory flat and reduce-scatters every micro-batch; unsharded holds
// every unit's whole gradient (P x param bytes) and reduces once.
TEST(Plan, MicroBatchesCountBothWaysOfAccumulatingGradients) {
  PlanInput in;
  in.model = ModelForParams(7e9, 32000, 4096, "llama");
  in.cluster.workers = 8;
  in.cluster.gpus_per_node = 8;
  in.cluster.device_memory_bytes = 80e9;
  in.micro_batch_size = 1;
  auto plan_at = [&](int micro, GradAccumulation g) {
    PlanInput x = in;
    x.batch_size = 8 * micro;
    x.grad_accumulation = g;
    absl::StatusOr<Plan> p = MakePlan(x);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->micro_batches, micro);
    return Of(*p, Strategy::kFullShard);
  };
  const StrategyPlan one = plan_at(1, GradAccumulation::kSharded);
  const StrategyPlan sharded = plan_at(4, GradAccumulation::kSharded);
  const StrategyPlan unsharded = plan_at(4, GradAccumulation::kUnsharded);
  EXPECT_EQ(plan_at(1, GradAccumulation::kUnsharded).transient_bytes, one.transient_bytes);  // one micro-batch: alike
  // Memory: flat in the micro-batches when sharded; unsharded adds the
  // whole gradient in bf16 less the two units sharded holds in flight.
  EXPECT_EQ(sharded.transient_bytes, one.transient_bytes);
  EXPECT_EQ(sharded.grads_bytes, one.grads_bytes);
  const double whole_bf16 = 2.0 * model::NumParams(in.model);
  EXPECT_GT(unsharded.transient_bytes - sharded.transient_bytes, 0.9 * whole_bf16);
  EXPECT_LT(unsharded.transient_bytes - sharded.transient_bytes, whole_bf16 + 1e6);
  // Communication: three more reduce-scatters of the whole gradient (fp32 by
  // default) when sharded, over 8 ranks.
  const double rs = 4.0 * model::NumParams(in.model) * 7 / 8;
  EXPECT_NEAR(static_cast<double>(sharded.comm_bytes - unsharded.comm_bytes), 3 * rs, 0.01 * rs);
}

// The 70B full fine-tune on 64 GPUs at batch 256 (4 micro-batches a rank):
// it does not fit when gradients accumulate unsharded.
TEST(Plan, SeventyBillionWithUnshardedAccumulationDoesNotFit) {
  PlanInput in;
  in.model = ModelForParams(7e10, 128256, 4096, "llama");
  in.cluster.workers = 64;
  in.cluster.gpus_per_node = 8;
  in.cluster.device_memory_bytes = 80e9;
  in.batch_size = 256;
  in.micro_batch_size = 1;
  in.grad_accumulation = GradAccumulation::kUnsharded;
  absl::StatusOr<Plan> unsharded = MakePlan(in);
  ASSERT_TRUE(unsharded.ok()) << unsharded.status();
  const StrategyPlan& u = Of(*unsharded, Strategy::kFullShard);
  EXPECT_FALSE(u.fits || u.fits_checkpointed) << "140 GB of bf16 gradients per rank";
  in.grad_accumulation = GradAccumulation::kSharded;
  absl::StatusOr<Plan> sharded = MakePlan(in);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_TRUE(Of(*sharded, Strategy::kFullShard).fits_checkpointed);
}

// What the vocabulary-parallel head moves per micro-batch over a group of g
// with `rows` tokens in all, the table being `param` of `unit`: hidden states
// (p), targets, [rows, 2 + cut rows] fp32 statistics gathered, dL/dh (r)
// reduce-scattered. Over the world of R > 1 groups: R times the rows, each
// exchange's stage across the replicas (a rank's own tokens, `rows` / g),
// and once a step the parts of the table's gradient (1/R of a shard each).
int64_t VocabHeadBytes(const ShardLayout& unit, int param, int64_t rows, int64_t C, int p, int r, int g, int R = 1) {
  const int64_t cuts = static_cast<int64_t>(TableShard::CutRows(unit, param, R).size());
  const int64_t own = rows / g, all = R * rows, stats = (2 + cuts) * 4;
  return comm::RingAllGatherBytes(all * C * p, g) + comm::RingAllGatherBytes(all * 8, g) +
         comm::RingAllGatherBytes(g * R * all * stats, g) + comm::RingReduceScatterBytes(all * C * r, g) +
         comm::RingAllGatherBytes(R * own * C * p, R) + comm::RingAllGatherBytes(R * own * 8, R) +
         comm::RingAllGatherBytes(R * all * stats, R) + comm::RingReduceScatterBytes(R * own * C * r, R) +
         comm::RingAllGatherBytes(R * ((unit.shard_numel + R - 1) / R) * r, R);
}

// [parallelism] sparse_embedding on an 8B llama over 8 GPUs: the token
// table's gather and reduce-scatter become its tokens' ids, rows and rows'
// gradients, and the head computes its loss over the vocabulary table's
// shards (lm_head untied, wte tied): the group's hidden states, targets and
// statistics go out and dL/dh comes back instead of the gathered unit and
// its gradient (untied, the head's norm is all-reduced once per step, and
// its gradient every micro-batch).
// Neither the gathered table nor its unsharded gradient is held. Where the
// group's tokens outnumber the vocabulary the head gathers the table, and
// tied, the rows come on top.
TEST(Plan, SparseEmbeddingMovesRowsNotTheTable) {
  PlanInput in;
  in.model = ModelForParams(8e9, 128256, 4096, "llama");
  in.cluster.workers = 8;
  in.batch_size = 8;
  in.micro_batch_size = 1;
  const int g = 8, p = 2, r = 4;  // bf16 parameters, fp32 reductions (the defaults)
  const int64_t rows = int64_t{g} * in.model.block_size, C = in.model.n_embd;
  ASSERT_LT(rows, in.model.vocab_size) << "the group's tokens must be the fewer bytes";
  const int64_t moved = comm::RingAllGatherBytes(rows * 8, g) + comm::RingReduceScatterBytes(rows * C * p, g) +
                        comm::RingAllGatherBytes(rows * C * r, g);
  auto head = [&](const ShardLayout& unit, int param) { return VocabHeadBytes(unit, param, rows, C, p, r, g); };
  auto moves = [&](int64_t unit) {
    return comm::RingAllGatherBytes(unit * p, g) + comm::RingReduceScatterBytes(unit * r, g);
  };
  const int64_t activations = rows * C * (p + 4 + r);  // the head's hidden states and dL/dh

  const StrategyPlan dense = Of(*MakePlan(in), Strategy::kFullShard);
  in.sparse_embedding = true;
  const StrategyPlan sparse = Of(*MakePlan(in), Strategy::kFullShard);
  const std::vector<ShardLayout> units = *model::OwnershipMap(in.model, g);
  const int64_t table = units.front().padded_numel, head_unit = units.back().padded_numel;
  EXPECT_EQ(dense.comm_bytes - sparse.comm_bytes,
            moves(table) + moves(head_unit) - moved - head(units.back(), 1) -
                comm::RingAllReduceBytes(C * p, p, g) - comm::RingAllReduceBytes(C * r, r, g));
  // (The gathered lm_head's gradient is held with the last block's, where
  // the exchanged head holds two blocks'.)
  const int64_t block = units[1].padded_numel;
  EXPECT_EQ(dense.transient_bytes - sparse.transient_bytes,
            2 * p * table + p * head_unit + p * (head_unit - block) - rows * C * (p + r) - activations -
                4 * head_unit / g);
  EXPECT_EQ(dense.state_bytes, sparse.state_bytes);
  EXPECT_LT(sparse.exposed_comm_s, dense.exposed_comm_s);
  // Two micro-batches a step: the norm, which changes only with the
  // optimizer, is summed once, and the first block stays gathered from the
  // first's backward into the second's forward; everything else is per
  // micro-batch (sharded accumulation reduces each).
  in.batch_size = 2 * g;
  EXPECT_EQ(Of(*MakePlan(in), Strategy::kFullShard).comm_bytes,
            2 * sparse.comm_bytes - comm::RingAllReduceBytes(C * p, p, g) - comm::RingAllGatherBytes(block * p, g));
  in.batch_size = g;

  in.model.tie_word_embeddings = true;
  const StrategyPlan tied_sparse = Of(*MakePlan(in), Strategy::kFullShard);
  in.sparse_embedding = false;
  const StrategyPlan tied_dense = Of(*MakePlan(in), Strategy::kFullShard);
  const std::vector<ShardLayout> tied_units = *model::OwnershipMap(in.model, g);
  const int64_t tied_table = tied_units.front().padded_numel;
  EXPECT_EQ(tied_sparse.comm_bytes - tied_dense.comm_bytes, moved + head(tied_units.front(), 0) - moves(tied_table));
  EXPECT_EQ(tied_sparse.transient_bytes - tied_dense.transient_bytes,
            rows * C * (p + r) + activations + 4 * tied_table / g - 2 * p * tied_table);
  EXPECT_LT(tied_sparse.exposed_comm_s, tied_dense.exposed_comm_s);

  in.micro_batch_size = 4;  // (more tokens than words: the table is the fewer bytes)
  in.batch_size = g * in.micro_batch_size;
  const int64_t many = int64_t{g} * in.micro_batch_size * in.model.block_size;
  ASSERT_GT(many, in.model.vocab_size);
  const StrategyPlan gathered = Of(*MakePlan(in), Strategy::kFullShard);
  in.sparse_embedding = true;
  const StrategyPlan gathered_sparse = Of(*MakePlan(in), Strategy::kFullShard);
  EXPECT_EQ(gathered_sparse.comm_bytes - gathered.comm_bytes,
            comm::RingAllGatherBytes(many * 8, g) + comm::RingReduceScatterBytes(many * C * p, g) +
                comm::RingAllGatherBytes(many * C * r, g));
}

// Across replicas (hybrid_shard, 2 groups of 4) at 2048 tokens a sequence
// the untied table's rows' gradients, gathered across the replicas, are
// fewer bytes than its shard's all-reduce, which they replace; and the head
// computes over the world, its table's parts gathered across the replicas
// instead of the head unit's shard all-reduced (its norm's gradient is).
TEST(Plan, SparseEmbeddingGathersRowsAcrossReplicas) {
  PlanInput in;
  in.model = ModelForParams(8e9, 128256, 4096, "llama");
  in.model.block_size = 2048;
  in.cluster.workers = 8;
  in.cluster.gpus_per_node = 4;
  in.batch_size = 8;
  in.micro_batch_size = 1;
  const StrategyPlan dense = Of(*MakePlan(in), Strategy::kHybridShard);
  in.sparse_embedding = true;
  const StrategyPlan sparse = Of(*MakePlan(in), Strategy::kHybridShard);
  const int g = 4, replicas = 2, p = 2, r = 4;
  const std::vector<ShardLayout> units = *model::OwnershipMap(in.model, g);
  const int64_t table = units.front().padded_numel, head_unit = units.back().padded_numel;
  const int64_t rows = int64_t{g} * in.model.block_size, C = in.model.n_embd;
  ASSERT_LT(replicas * rows * C, 2 * table / g) << "the rows must be the fewer bytes";
  ASSERT_TRUE(comm::HeadOverWorldBeatsAllReduce(rows / g, C, head_unit / g, p, r, replicas));
  // The untied head over the vocabulary of the world (its norm and the
  // norm's gradient all-reduced, the gradient across the replicas too)
  // instead of its gather and reduce-scatter and its shard's all-reduce.
  const int64_t saved = comm::RingAllGatherBytes(table * p, g) + comm::RingReduceScatterBytes(table * r, g) +
                        comm::RingAllReduceBytes(table / g * r, r, replicas) +
                        comm::RingAllGatherBytes(head_unit * p, g) + comm::RingReduceScatterBytes(head_unit * r, g) +
                        comm::RingAllReduceBytes(head_unit / g * r, r, replicas);
  const int64_t moved = comm::RingAllGatherBytes(rows * 8, g) + comm::RingReduceScatterBytes(rows * C * p, g) +
                        comm::RingAllGatherBytes(rows * C * r, g) +
                        comm::RingAllGatherBytes(replicas * rows * (C * r + 8), replicas) +
                        VocabHeadBytes(units.back(), 1, rows, C, p, r, g, replicas) +
                        comm::RingAllReduceBytes(C * p, p, g) + comm::RingAllReduceBytes(C * r, r, g) +
                        comm::RingAllReduceBytes(C * r, r, replicas);
  EXPECT_EQ(dense.comm_bytes - sparse.comm_bytes, saved - moved);
  const int64_t block = units[1].padded_numel;  // (the gathered lm_head's gradient is held with a block's)
  EXPECT_EQ(dense.transient_bytes - sparse.transient_bytes,
            2 * p * table + p * head_unit + p * (head_unit - block) - rows * C * (p + replicas * r) -
                replicas * rows * C * (p + 4 + r) - 4 * head_unit / g - 4 * head_unit / g / replicas);
  EXPECT_LT(sparse.step_s, dense.step_s);
}

// The small GPT (tied table, 43% of its parameters with wpe) on 2 hosts x 2
// ranks, hybrid_shard with one micro-batch a rank: the head computes over
// every rank's tokens, each rank over its replica's half of its shard, so
// the table's shard is never all-reduced across the hosts; its halves'
// gradients are all-gathered instead, and the hidden states, targets,
// statistics and dL/dh cross the hosts (each rank's own tokens once).
TEST(Plan, TiedHeadOverTheWorldReplacesTheTablesAllReduce) {
  PlanInput in;
  in.model.family = "gpt2";
  in.model.n_layer = 6;
  in.model.n_head = 8;
  in.model.n_embd = 512;
  in.model.vocab_size = 16384;
  in.model.block_size = 256;
  in.cluster.workers = 4;
  in.cluster.gpus_per_node = 2;
  in.cluster.inter_node_bw = 12.5e6;  // 100 Mbit/s
  in.batch_size = 8;
  in.micro_batch_size = 2;
  in.param_dtype = in.reduce_dtype = DType::kFloat32;
  const StrategyPlan dense = Of(*MakePlan(in), Strategy::kHybridShard);
  in.sparse_embedding = true;
  const StrategyPlan sparse = Of(*MakePlan(in), Strategy::kHybridShard);
  const int g = 2, R = 2, p = 4, r = 4;
  const ShardLayout table_unit = model::OwnershipMap(in.model, g)->front();
  const int64_t table = table_unit.padded_numel, shard = table / g, C = in.model.n_embd;
  const int64_t own = int64_t{in.micro_batch_size} * in.model.block_size, rows = g * own, world_rows = R * rows;
  ASSERT_TRUE(comm::HeadOverWorldBeatsAllReduce(own, C, shard, p, r, R));
  const int64_t saved = comm::RingAllGatherBytes(table * p, g) + comm::RingReduceScatterBytes(table * r, g) +
                        comm::RingAllReduceBytes(shard * r, r, R);
  const int64_t lookup = comm::RingAllGatherBytes(rows * 8 * 2, g) + comm::RingReduceScatterBytes(rows * C * p, g) +
                         comm::RingAllGatherBytes(rows * C * r, g) +
                         comm::RingAllGatherBytes(R * rows * (C * r + 8 * 2), R);
  const int64_t head = VocabHeadBytes(table_unit, 0, rows, C, p, r, g, R);
  EXPECT_EQ(dense.comm_bytes - sparse.comm_bytes, saved - lookup - head);
  // Across the hosts, where the link is the bottleneck, that is the shard's
  // all-reduce (2 x half a shard) against half a shard and the tokens'.
  const int64_t stats = (2 + static_cast<int64_t>(TableShard::CutRows(table_unit, 0, R).size())) * 4;
  const int64_t across = comm::RingAllGatherBytes(R * own * C * p, R) + comm::RingAllGatherBytes(R * own * 8, R) +
                         comm::RingAllGatherBytes(R * world_rows * stats, R) +
                         comm::RingReduceScatterBytes(R * own * C * r, R) +
                         comm::RingAllGatherBytes(R * ((shard + R - 1) / R) * r, R);
  EXPECT_LT(across + comm::RingAllGatherBytes(R * rows * (C * r + 8 * 2), R), comm::RingAllReduceBytes(shard * r, r, R));
  EXPECT_LT(sparse.step_s, dense.step_s);
}

}  // namespace
}  // namespace shardline
