// NcclCommunicator: the Communicator over NCCL for GPU ranks.
//
// Collectives run on the communicator's own CUDA stream ("comm stream"). A
// collective first waits (cudaStreamWaitEvent) for an event recorded on the
// caller's compute stream, so it sees every kernel issued before the call;
// Work::Wait then blocks the host until the collective finished (polling its
// completion event up to the deadline) and makes the compute stream wait for
// it, so kernels issued afterwards see the result.
//
// Bootstrap: rank 0 creates the NCCL unique id and publishes it in the store;
// init is non-blocking and polled against the connect deadline, so a missing
// rank is an error, never a hang. On a failed or late op the NCCL
// communicator is aborted (ncclCommAbort) and never used again.
//
// Only built where the CUDA toolkit and NCCL are found; run where a GPU is.
#pragma once

#include <memory>
#include <string>

#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"

namespace shardline::comm {

struct NcclOptions {
  int device = 0;
  cudaStream_t compute_stream = nullptr;  // the stream the caller computes on
  absl::Duration op_timeout = absl::Seconds(60);
  absl::Duration connect_timeout = absl::Seconds(60);
};

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const std::string& group_name, int rank, int size,
    const NcclOptions& options);

// True where a CUDA device is visible (tests labelled gpu skip otherwise).
bool CudaDeviceAvailable();

}  // namespace shardline::comm
