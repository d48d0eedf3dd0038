// Plan: what each strategy would cost for a model on a cluster, before a job
// runs: per-rank memory by kind, bytes and time of communication per step,
// predicted step time, and the fastest strategy that fits (`shardctl plan`).
//
// The model is the engine's own accounting, not a fit:
//  - state by kind is the engine's exact formula (units padded to the shard
//    group, fp32 master aliased to fp32 parameters), i.e. docs/design.md's table;
//  - transient memory is the unsharded units the schedule holds at once
//    (the tied embedding, the head, the unit being computed and the
//    prefetched ones) and one unit's unsharded gradient;
//  - activations follow Korthikanti et al. 2022 (GPT-2: per layer
//    s*b*h*(34 + 5*a*s/h) bytes at 2-byte activations, doubled in fp32; the
//    llama family: the same count over its own saved tensors, with GQA's
//    narrower k and v, the rotated q and k, and SwiGLU's three
//    intermediate-wide tensors) plus the head's logits; with checkpointing
//    each layer keeps its input and one layer is live during its
//    recomputation;
//  - compute is (6N + 12*L*H*Q*T) FLOPs per token (+1/3 with checkpointing)
//    at the given FLOP/s; communication is ring bytes at the bandwidth of
//    the link the group spans; the step's time is the engine's unit schedule
//    over those (step_schedule.h), so that only what the engine overlaps is
//    hidden.
//
// Pure arithmetic: no LibTorch, no I/O. Errors name the flag at fault.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/device_spec.h"
#include "common/job/job_config.h"

namespace shardline {

struct ClusterSpec {
  // What a rank computes on, for what its process holds beyond its live
  // tensors (AllocatorReserveBytes).
  DeviceKind device = DeviceKind::kCuda;
  int workers = 8;
  int gpus_per_node = 8;
  double device_memory_bytes = 80e9;
  double intra_node_bw = 150e9;  // bytes/s per rank through the ring (bus bandwidth)
  double inter_node_bw = 25e9;   // bytes/s per rank
  double flops = 400e12;         // achieved FLOP/s per device
  double memory_bw = 2e12;       // bytes/s per device (optimizer step)
  // Seconds of a rank's compute each byte it sends costs, where the transport
  // runs on the cores that compute (Gloo over TCP on CPU workers: the kernel
  // copies and checksums every byte on both ends). 0 for GPUs, whose copies
  // run beside the compute.
  double comm_cpu_s_per_byte = 0;
};

struct PlanInput {
  ModelConfig model;
  int batch_size = 0;        // global, in sequences; 0 = one micro-batch per rank
  int micro_batch_size = 1;  // sequences per rank per forward
  // Over several micro-batches, where gradients are sharded: sharded (each
  // micro-batch reduce-scattered, micro-batches x the reduce-scatter bytes)
  // or unsharded (every unit's whole gradient held until the last one).
  GradAccumulation grad_accumulation = GradAccumulation::kSharded;
  DType param_dtype = DType::kBFloat16, reduce_dtype = DType::kFloat32;
  // AdamW's state ([optimizer] master_dtype / moments_dtype): fp32 both,
  // bf16 both on bf16 parameters (no master: 4 bytes a parameter, not 12),
  // or 8-bit moments (about 2 bytes a parameter: common/model/moment_blocks.h).
  DType master_dtype = DType::kFloat32;
  MomentsDType moments_dtype = MomentsDType::kFloat32;
  int max_inflight_all_gathers = 2;
  int shard_group_size = 0;  // hybrid strategies; 0 = gpus_per_node
  // LoRA: the state is the frozen base in the param dtype (sharded over the
  // shard group, or whole) plus the adapters' state as the strategy keeps
  // any unit's; a sharded base is gathered per use as full_shard does; only
  // adapter gradients are reduced; the base gets no weight gradient (4 FLOPs
  // per weight and token instead of 6). The adapters' rank-wide activations
  // are left out (r / hidden of a projection's).
  LoraConfig lora;
  // [parallelism] sparse_embedding: a token table whose parameters are
  // sharded is looked up by moving its tokens' rows; untied, it is never
  // gathered nor held whole (worker/engine/sparse_embedding.h). The head
  // computes its loss over its vocabulary table's shards (lm_head, or the
  // tied table) where that moves fewer bytes than gathering the unit that
  // holds it (worker/engine/vocab_parallel_head.h); a tied table is
  // otherwise gathered for the head alone and its reduction starts after
  // the head's backward.
  bool sparse_embedding = false;
  // [memory] recompute_cheap_ops: the blocks keep no GELU, SwiGLU or norm
  // output (LayerActivationBytes).
  bool recompute_cheap_ops = true;
  // [parallelism] shard_optimizer_across_replicas under hybrid_shard: each
  // unit but those the sparse embedding trains keeps 1/R of its shard's
  // master and moments, reduce-scatters its shard across the R replicas
  // and all-gathers the updated pieces (param dtype) during the update.
  bool shard_optimizer_across_replicas = false;
  ClusterSpec cluster;
};

struct StrategyPlan {
  Strategy strategy = Strategy::kFullShard;
  int shard_group = 1;
  // Whether the job's sparse_embedding applies: a table sharded over a
  // group of more than one rank (else it is gathered as any unit's).
  bool sparse_embedding = false;
  int64_t params_bytes = 0, grads_bytes = 0, master_bytes = 0, optimizer_bytes = 0, state_bytes = 0;
  int64_t transient_bytes = 0;  // unsharded units and gradients in flight
  int64_t activation_bytes = 0, activation_bytes_checkpointed = 0;
  int64_t peak_bytes = 0, peak_bytes_checkpointed = 0;  // live tensors
  // What the rank's allocator and process hold beyond the live peak
  // (AllocatorReserveBytes); `fits` judges peak + reserve.
  int64_t reserve_bytes = 0, reserve_bytes_checkpointed = 0;
  bool fits = false, fits_checkpointed = false;
  int64_t comm_bytes = 0;  // sent per rank per step
  double compute_s = 0, comm_s = 0, exposed_comm_s = 0, optimizer_s = 0;
  double step_s = 0, step_s_checkpointed = 0;
  double tokens_per_second = 0;
};

struct Plan {
  int64_t params = 0;
  int64_t trainable_params = 0;  // params, or the adapters' under LoRA
  double flops_per_token = 0;
  int64_t tokens_per_step = 0;
  int micro_batches = 1;
  std::vector<StrategyPlan> strategies;
  // The fastest strategy that fits (without checkpointing if any does);
  // empty if none fits.
  std::string recommended;
  bool recommended_checkpointing = false;
};

absl::StatusOr<Plan> MakePlan(const PlanInput& in);

// What a rank holds beyond `live_peak` bytes of live tensors:
//  - cuda: the caching allocator's blocks cached or split beyond what is
//    allocated, an eighth of the peak (reserved over allocated was 1.09 to
//    1.14 at the peaks of GPT-2 350M at N = 1, 2, 4 on an H200, Shardline's
//    and FSDP2's alike: bench/results/gpu_compare_h200.md). The CUDA
//    context and NCCL's buffers, outside the allocator, are not counted.
//  - cpu: the process itself (LibTorch's code and heap: 138 MiB of peak RSS
//    for a model of 1 MiB on the CPU workers here) and the host block
//    cache's excess (host_block_cache.h: blocks rounded up to at most a
//    sixteenth of their size class, and freed blocks kept for their class
//    within a quarter of the high water), a tenth of the peak: 9.7% at the
//    seeds' workload at full size (bench/results/qlora_memory.md), inside
//    the cache's bound of 1/16 + 1/4.
int64_t AllocatorReserveBytes(DeviceKind device, double live_peak);

// What a job file says of the plan (model, batch, dtypes, prefetch, shard
// group, LoRA) on `workers` ranks; the rest of the cluster keeps its defaults.
PlanInput PlanInputForJob(const JobConfig& c, int workers);

// Llama's SwiGLU width for `hidden`: 8/3 x hidden rounded to a multiple of
// 256 (at least 256).
int DefaultIntermediateSize(int hidden);

// A model of `params` parameters (within 0.5% wherever the embedding alone
// does not exceed it) for `--params` without a shape: `family` "gpt2" (heads
// of 64, tied) or "llama" (heads of 128 where hidden allows, else 64; GQA
// with a quarter as many key/value heads; SwiGLU width 8/3 x hidden rounded
// to 256; untied). Layers grow as the cube root of the size (hidden about
// 128 x layers, as GPT-2 and Llama do); hidden is the multiple of 64 that
// lands closest.
ModelConfig ModelForParams(double params, int vocab_size, int seq_len, const std::string& family = "gpt2");

// Tables and JSON for shardctl.
std::string PlanTable(const Plan& p);
std::string PlanJson(const Plan& p);

}  // namespace shardline
