// GlooCommunicator: the Communicator over Gloo's TCP transport, using the
// copy of Gloo inside LibTorch (c10d::ProcessGroupGloo point-to-point).
//
// All-gather and reduce-scatter are ring algorithms written here on Gloo's
// send/recv, so that reduce-scatter moves (n-1)/n of the buffer per rank
// (c10d's Gloo reduce-scatter is an all-reduce followed by a slice) and so
// that every ring step waits with the op's deadline and knows which peer it
// waits for. The barrier and an all-reduce up to 64 KiB run on the same
// ring; a larger all-reduce and broadcast use Gloo's own algorithms (its
// segmented ring all-reduce beats an unsegmented one; see the .cc), whose
// errors name no peer. A group has at most 512 ranks (ring steps are tags).
//
// Ops run on one communication thread per communicator, in call order, so a
// prefetched all-gather overlaps the caller's compute.
//
// CUDA tensors are staged through host memory: the op waits (on its thread)
// for the caller's stream as it was at the call, copies the inputs to the
// host, runs there and copies the outputs back before it completes. This is
// how several ranks share one GPU where NCCL refuses that; it is not fast.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"

namespace shardline::comm {

struct GlooOptions {
  std::string hostname = "127.0.0.1";   // interface to bind Gloo's TCP pairs to
  absl::Duration op_timeout = absl::Seconds(60);  // deadline of one collective
  absl::Duration connect_timeout = absl::Seconds(60);
  // The job rank of each group rank (empty: the same): what errors name,
  // and what a LinkFault carries.
  std::vector<int> job_ranks;
};

// Connects `size` ranks through `store` (keys are prefixed by `group_name`, so
// several groups can share one store). Blocks until every rank joined or the
// connect timeout passed.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const std::string& group_name, int rank, int size,
    const GlooOptions& options);

}  // namespace shardline::comm
