// Groups: how a rank's world splits into the shard group and the replicate
// group it belongs to, and one function that connects both over the backend
// its device calls for (docs/design.md: NCCL for CUDA, Gloo for CPU). Nothing
// here names a backend's types, so callers stay backend-neutral.
//
// The world of R ranks is split into shard groups of G consecutive ranks
// (state is sharded over a shard group) and replicate groups of the ranks
// with the same position in every shard group (gradients are all-reduced
// across them). ZeRO strategies have G = R, no_shard G = 1, the hybrid ones
// the configured shard_group_size.
//
// Rendezvous goes through a c10d Store (the coordinator's, or a TCP store):
// Gloo's addresses and NCCL's unique id travel there, under the group's
// prefix. Every wait is bounded by the connect timeout.
#pragma once

#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job/job_config.h"
#include "worker/comm/communicator.h"
#include "worker/device/device.h"

namespace shardline {

// Decides G for a world and config, and which ranks form this rank's groups.
struct GroupPlan {
  int shard_size = 1, replicate_size = 1;
  int shard_index = 0;      // which shard group (rank / G)
  int shard_rank = 0;       // rank inside it (rank % G)
  std::string shard_name, replicate_name;  // store prefixes
};
GroupPlan PlanGroups(const JobConfig& config, int rank, int world);

struct Communicators {
  std::unique_ptr<comm::Communicator> shard;      // size G
  std::unique_ptr<comm::Communicator> replicate;  // size R / G
};

// kAuto follows the device. kGloo on a CUDA device stages every buffer
// through host memory (several ranks sharing one GPU, where NCCL refuses
// that); kNccl needs a CUDA device.
enum class Backend { kAuto, kGloo, kNccl };
absl::StatusOr<Backend> ParseBackend(const std::string& name);
// The backend that runs for `requested` on `device`, or why none can.
absl::StatusOr<Backend> ResolveBackend(Backend requested, const Device& device);

// Connects this rank's shard and replicate groups through `store` (a group
// of one needs no store and moves nothing). `timeout` bounds the rendezvous
// and every later collective. Gloo binds its pairs to `bind_address` and
// publishes it through the store, where its peers find it; NCCL's bootstrap
// follows NCCL_SOCKET_IFNAME (worker/run/collective_address.h).
absl::StatusOr<Communicators> ConnectGroups(const c10::intrusive_ptr<c10d::Store>& store, const GroupPlan& plan,
                                            const Device& device, Backend backend, absl::Duration timeout,
                                            const std::string& bind_address);

}  // namespace shardline
