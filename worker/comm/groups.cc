#include "worker/comm/groups.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/link_probe.h"
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

// A link this rank's probe found cut, as the rendezvous' failure: named
// in the message and as the link that failed (sequence -1: before any op of
// the attempt), so that the coordinator leaves one end out of the next one.
absl::Status CutLink(absl::Status failed, const comm::UnreachablePeer& p, int rank,
                     const std::vector<int>& job_ranks) {
  auto job_rank = [&](int r) { return r < static_cast<int>(job_ranks.size()) ? job_ranks[r] : r; };
  return comm::WithLinkFault(
      absl::Status(failed.code(), absl::StrCat(failed.message(), "; rank ", job_rank(p.rank), " at ", p.address,
                                               " cannot be reached from here (", p.why, ")")),
      comm::LinkFault{job_rank(rank), job_rank(p.rank), /*seq=*/-1, /*step=*/0});
}

// Gloo's full-mesh connect cannot be interrupted, and names no peer when it
// times out: on emulated hosts with one link cut it failed after 25 s at a
// 5 s timeout, long after a rank that did connect had failed its first
// collective and been blamed. So it runs on a thread of its own while this
// rank probes its peers (worker/comm/link_probe.h) after 2 s and every 5 s
// after: a peer that published its address and drops the connection fails
// the rendezvous at once, naming the link. An abandoned connect finishes on
// its thread, and its communicator is dropped there.
absl::StatusOr<std::unique_ptr<comm::Communicator>> ConnectGloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                                const std::string& name, int rank, int size,
                                                                comm::GlooOptions o) {
  comm::LinkProbeOptions po;
  po.bind_address = o.hostname;
  std::unique_ptr<comm::LinkProbe> probe =
      comm::LinkProbe::Start(c10::make_intrusive<c10d::PrefixStore>(name + "probe", store), rank, size, po);
  struct Connecting {
    absl::Mutex mu;
    std::optional<absl::StatusOr<std::unique_ptr<comm::Communicator>>> result ABSL_GUARDED_BY(mu);
    bool abandoned ABSL_GUARDED_BY(mu) = false;
  };
  auto c = std::make_shared<Connecting>();
  const std::vector<int> job_ranks = o.job_ranks;
  std::thread([c, store, name, rank, size, o] {
    auto made = comm::CreateGlooCommunicator(store, name, rank, size, o);
    absl::MutexLock lock(&c->mu);
    if (!c->abandoned) c->result = std::move(made);  // else dropped here, outside the caller
  }).detach();
  auto ready = [&c]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) { return c->result.has_value(); };
  absl::Duration wait = absl::Seconds(2);
  while (true) {
    std::optional<absl::StatusOr<std::unique_ptr<comm::Communicator>>> made;
    {
      absl::MutexLock lock(&c->mu);
      if (c->mu.AwaitWithTimeout(absl::Condition(&ready), wait)) made = std::move(c->result);
    }
    if (made) {
      if (made->ok() || probe == nullptr) return std::move(*made);
      const std::vector<comm::UnreachablePeer> cut = probe->Unreachable();
      return cut.empty() ? made->status() : CutLink(made->status(), cut.front(), rank, job_ranks);
    }
    if (probe != nullptr) {
      const std::vector<comm::UnreachablePeer> cut = probe->Unreachable();
      absl::MutexLock lock(&c->mu);
      if (c->result.has_value()) continue;  // it ended during the probe: its result stands
      if (!cut.empty()) {
        c->abandoned = true;
        return CutLink(absl::UnavailableError(absl::StrCat("[rank ", job_ranks.empty() ? rank : job_ranks[rank],
                                                           "] group ", name, ": Gloo rendezvous stopped")),
                       cut.front(), rank, job_ranks);
      }
    }
    wait = absl::Seconds(5);
  }
}

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
  return ConnectGloo(store, name, rank, size, std::move(o));
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
