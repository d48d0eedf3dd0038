// NcclCommunicator: the Communicator over NCCL for GPU ranks, held to
// ProcessGroupNCCL's standard: every op is watched until it finishes, every
// CUDA and NCCL return code is checked, and a communicator that failed once is
// aborted (ncclCommAbort) and never used again.
//
// Streams. The caller computes on `compute_stream`. All-gather, broadcast and
// barrier run on the all-gather stream, reduce-scatter and all-reduce on the
// reduce-scatter stream (FSDP2's roles). Each call records an event on the
// compute stream and makes the op's stream wait for it, so the op sees every
// kernel issued on the compute stream before the call (work on other streams
// must be ordered onto the compute stream first). Work::WaitOnDevice makes the
// compute stream wait for the op's end event without blocking the host;
// Work::Wait blocks the host until the op finished and then does the same.
// Streams passed in belong to the caller and must outlive the communicator
// and its Works; streams the communicator created (options left null) it
// destroys. All tensors must be contiguous CUDA tensors on `device`; the
// calling thread's current device is left as it was.
//
// Buffers: as for every Communicator. In addition the communicator keeps a
// reference to an op's tensors until the op finished, failed, or a wait
// ordered the compute stream after it, so a buffer dropped early is never
// handed out again while NCCL still uses it (memory allocated on a stream
// other than the compute stream or the op's own must be kept until Done()).
//
// Sequence numbers are per communicator, 1-based, in call order. A call
// rejected for its arguments (InvalidArgument: wrong sizes, dtypes, devices,
// a non-contiguous or non-CUDA tensor) launches nothing, takes no sequence
// number, is not told to the observer and leaves the communicator usable
// (arguments are checked first, so this holds after an abort too).
//
// Stats and the observer are updated when the watchdog sees an op's end event
// complete, never at launch: calls, bytes (common/base/ring_bytes.h; a broadcast
// counts its buffer at the root, a barrier nothing), seconds as timed by CUDA
// events around the NCCL call on the op's stream. last_completed_seq is the
// highest n such that every op up to #n completed. Failed ops are not counted
// in the stats; the observer hears of them with ok=false. The observer hears
// of each launched op exactly once, before its Work reports it finished
// (Done(), a host Wait), one call at a time, from the watchdog or from the
// thread that saw the failure; it may call Stats() but no collective.
//
// Errors. The first failure aborts the communicator (ncclCommAbort, exactly
// once) and becomes status(): DeadlineExceeded when an op is not complete
// op_timeout after its launch (watchdog) or a host Wait ran out of time;
// Unavailable for NCCL's remote and system errors; Internal for other NCCL
// errors and every CUDA error. Messages start with "[rank N] <op> #<seq>: ".
// Every op still outstanding then fails with the same code, naming itself and
// the original failure; every later call fails at once with Aborted (it
// takes a sequence number, launches nothing, and the observer is not told).
//
// Threads. Collectives may be called from one thread at a time (any thread);
// Work methods, Stats() and status() from any thread. One watchdog thread per
// communicator polls the outstanding ops (every millisecond while there are
// any, asleep otherwise) and ncclCommGetAsyncError.
//
// Lifetime. A Work may outlive its communicator: it shares the op's record
// (events included) and the communicator's state, so nothing it reads
// dangles. The destructor stops the watchdog after one last poll; ops that had
// not finished by then are aborted with the communicator and their Works
// report Aborted. Otherwise the NCCL communicator is finalized and destroyed
// (aborted if that takes longer than op_timeout).
//
// Bootstrap: rank 0 creates the NCCL unique id and publishes it in the store
// under `group_name + "/nccl_unique_id"`; the others wait for it. Init is
// non-blocking and polled; the whole connect is bounded by connect_timeout and
// a late or failed init is aborted, never left to hang.
//
// Mode: the communicator is non-blocking (config.blocking = 0), chosen over
// blocking for what a daemon owes its other jobs: every NCCL call returns at
// once, so init, a first op's lazy connect to a dead peer, and finalize are
// each bounded by a deadline and can be aborted (NCCL's fault-tolerance
// model needs this mode; a blocking call can hang a thread that no abort may
// then touch, since ncclCommAbort must not race a call on the same handle).
// The price, in NCCL 2.28: each launch hands its group to a new NCCL thread
// and returns ncclInProgress, which Launch polls until the kernel is queued
// (yield first, then 200 us sleeps): tens of microseconds per collective, a
// few dozen collectives per step. At one rank NCCL takes a shortcut and
// never returns ncclInProgress; `nccl_test --two-ranks` (ctest
// nccl_two_ranks) runs the polled path.
//
// Only built where SHARDLINE_WITH_CUDA is defined (CUDA toolkit, NCCL and
// LibTorch's CUDA libraries found); runs where a GPU is.
#pragma once

#include <memory>
#include <string>

#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace shardline::comm {

struct NcclOptions {
  int device = 0;
  cudaStream_t compute_stream = nullptr;         // the stream the caller computes on (nullptr: the legacy default stream)
  cudaStream_t all_gather_stream = nullptr;      // all-gather, broadcast, barrier run here; nullptr: the communicator creates its own
  cudaStream_t reduce_scatter_stream = nullptr;  // reduce-scatter and all-reduce run here; nullptr: likewise
  absl::Duration op_timeout = absl::Seconds(60);       // launch to completion, enforced by the watchdog
  absl::Duration connect_timeout = absl::Seconds(60);  // unique-id exchange plus NCCL init
};

// Connects rank `rank` of `size` through `store`. Fails (never hangs) when a
// peer does not join within connect_timeout.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    c10::intrusive_ptr<c10d::Store> store, const std::string& group_name, int rank, int size,
    const NcclOptions& options);


}  // namespace shardline::comm
