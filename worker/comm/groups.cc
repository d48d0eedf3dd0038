#include "worker/comm/groups.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#ifdef SHARDLINE_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "worker/comm/nccl_communicator.h"
#endif

namespace shardline {

GroupPlan PlanGroups(const JobConfig& config, int rank, int world) {
  GroupPlan p;
  p.shard_size = ShardGroupSize(config, world);
  p.replicate_size = world / p.shard_size;
  p.shard_index = rank / p.shard_size;
  p.shard_rank = rank % p.shard_size;
  p.shard_name = absl::StrCat("shard.", p.shard_index, "/");
  p.replicate_name = absl::StrCat("replicate.", p.shard_rank, "/");
  return p;
}

absl::StatusOr<Backend> ParseBackend(const std::string& name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  return absl::InvalidArgumentError(absl::StrCat("backend '", name, "': expected auto, gloo or nccl"));
}

absl::StatusOr<Backend> ResolveBackend(Backend requested, const Device& device) {
  if (requested == Backend::kAuto) return device.is_cuda() ? Backend::kNccl : Backend::kGloo;
  if (requested == Backend::kNccl && !device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("backend nccl needs a CUDA device, not ", device.name()));
  }
  return requested;
}

namespace {

#ifdef SHARDLINE_WITH_CUDA
cudaStream_t RawStream(const Device& d, StreamRole role) {
  return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, d.stream(role)).stream();
}
#endif

absl::StatusOr<std::unique_ptr<comm::Communicator>> Connect(const c10::intrusive_ptr<c10d::Store>& store,
                                                            const std::string& name, int rank, int size,
                                                            const Device& device, Backend backend,
                                                            absl::Duration timeout, const std::string& bind_address,
                                                            std::vector<int> job_ranks) {
  if (size == 1) return comm::CreateSelfCommunicator();
  if (backend == Backend::kNccl) {
#ifdef SHARDLINE_WITH_CUDA
    comm::NcclOptions o;
    o.device = device.device().index();
    // Both groups' communicators use the device's streams: a replicate
    // all-reduce issued after a shard reduce-scatter on the reduce-scatter
    // stream runs after it (GradReduction relies on it).
    o.compute_stream = RawStream(device, StreamRole::kCompute);
    o.all_gather_stream = RawStream(device, StreamRole::kAllGather);
    o.reduce_scatter_stream = RawStream(device, StreamRole::kReduceScatter);
    o.op_timeout = timeout;
    o.connect_timeout = timeout;
    return comm::CreateNcclCommunicator(store, name, rank, size, o);
#else
    return absl::FailedPreconditionError("backend nccl: this build has no CUDA");
#endif
  }
  comm::GlooOptions o;
  o.job_ranks = std::move(job_ranks);
  o.hostname = bind_address;
  o.op_timeout = timeout;
  o.connect_timeout = timeout;
  return comm::CreateGlooCommunicator(store, name, rank, size, o);
}

}  // namespace

absl::StatusOr<Communicators> ConnectGroups(const c10::intrusive_ptr<c10d::Store>& store, const GroupPlan& plan,
                                            const Device& device, Backend backend, absl::Duration timeout,
                                            const std::string& bind_address) {
  SL_ASSIGN_OR_RETURN(const Backend b, ResolveBackend(backend, device));
  Communicators c;
  // Which job rank each group rank is (errors name job ranks).
  std::vector<int> shard_ranks, replicate_ranks;
  for (int i = 0; i < plan.shard_size; ++i) shard_ranks.push_back(plan.shard_index * plan.shard_size + i);
  for (int i = 0; i < plan.replicate_size; ++i) replicate_ranks.push_back(i * plan.shard_size + plan.shard_rank);
  SL_ASSIGN_OR_RETURN(c.shard, Connect(store, plan.shard_name, plan.shard_rank, plan.shard_size, device, b, timeout,
                                       bind_address, std::move(shard_ranks)));
  SL_ASSIGN_OR_RETURN(c.replicate, Connect(store, plan.replicate_name, plan.shard_index, plan.replicate_size, device,
                                           b, timeout, bind_address, std::move(replicate_ranks)));
  return c;
}

}  // namespace shardline
