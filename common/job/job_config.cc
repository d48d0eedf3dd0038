#include "common/job/job_config.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"

namespace shardline {

const char* StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kNoShard: return "no_shard";
    case Strategy::kZero1: return "zero1";
    case Strategy::kShardGradOp: return "shard_grad_op";
    case Strategy::kFullShard: return "full_shard";
    case Strategy::kHybridShard: return "hybrid_shard";
    case Strategy::kHybridShardZero2: return "hybrid_shard_zero2";
  }
  return "?";
}

absl::StatusOr<Strategy> ParseStrategy(const std::string& s) {
  for (Strategy v : {Strategy::kNoShard, Strategy::kZero1, Strategy::kShardGradOp,
                     Strategy::kFullShard, Strategy::kHybridShard, Strategy::kHybridShardZero2}) {
    if (s == StrategyName(v)) return v;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown strategy ", Quoted(s),
      " (expected no_shard, zero1, shard_grad_op, full_shard, hybrid_shard, hybrid_shard_zero2)"));
}

const char* GradAccumulationName(GradAccumulation g) {
  return g == GradAccumulation::kSharded ? "sharded" : "unsharded";
}

double EpochAt(int64_t completed_steps, int64_t batch_size, int64_t sequences_per_epoch) {
  if (sequences_per_epoch <= 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(completed_steps) * static_cast<double>(batch_size) /
         static_cast<double>(sequences_per_epoch);
}

const char* LrScheduleName(LrSchedule s) {
  switch (s) {
    case LrSchedule::kCosine: return "cosine";
    case LrSchedule::kLinear: return "linear";
    case LrSchedule::kConstant: return "constant";
    case LrSchedule::kWsd: return "wsd";
  }
  return "?";
}

const char* MomentsDTypeName(MomentsDType d) {
  switch (d) {
    case MomentsDType::kFloat32: return "fp32";
    case MomentsDType::kBFloat16: return "bf16";
    case MomentsDType::kDynamic8Bit: return "8bit";
  }
  return "?";
}

bool MomentsPairWithMaster(MomentsDType moments, DType master) {
  switch (moments) {
    case MomentsDType::kFloat32: return master == DType::kFloat32;
    case MomentsDType::kBFloat16: return master == DType::kBFloat16;
    case MomentsDType::kDynamic8Bit: return true;
  }
  return false;
}

const char* LoraBaseName(LoraBase b) { return b == LoraBase::kSharded ? "sharded" : "replicated"; }
const char* LoraBaseDTypeName(LoraBaseDType d) { return d == LoraBaseDType::kNf4 ? "nf4" : "param_dtype"; }

bool ShardsParams(Strategy s) { return s == Strategy::kFullShard || s == Strategy::kHybridShard; }
bool ShardsGrads(Strategy s) {
  return s == Strategy::kShardGradOp || s == Strategy::kHybridShardZero2 || ShardsParams(s);
}
bool IsHybrid(Strategy s) {
  return s == Strategy::kHybridShard || s == Strategy::kHybridShardZero2;
}

int ShardGroupSize(const JobConfig& c, int world_size) {
  if (c.parallelism.strategy == Strategy::kNoShard) return 1;
  if (IsHybrid(c.parallelism.strategy) && c.parallelism.shard_group_size > 0) {
    return c.parallelism.shard_group_size;
  }
  return world_size;
}

}  // namespace shardline
