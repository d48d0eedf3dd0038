// What a rank measures right after its rendezvous, before the engine is
// built: the figures `strategy = "auto"` plans on (the coordinator takes the
// slowest rank's: common/plan/strategy_choice.h) and each rank's send times,
// by which the coordinator names a slow link.
//
// Every rank of the group calls each function at once (the collectives pair
// them up; MeasureCompute's share of the cores is only what training will
// see if every rank computes at that moment). Each takes a few collectives
// or well under a second of compute. Threads: the caller's. Errors: the
// collectives' (a timeout names the op), or the device's.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job/job_config.h"
#include "worker/comm/communicator.h"
#include "worker/device/device.h"

namespace shardline {

struct LinkFigures {
  double bus_bandwidth = 0;  // bytes/s per rank through the ring, as nccl-tests' busbw
  // CPU seconds this process spent per byte it sent meanwhile, where the
  // transport runs on the host's cores (0 on a device-ordered one: NCCL's
  // copies run beside the compute).
  double cpu_s_per_byte = 0;
};

// The median of three timed 8 MiB all-reduces over `c` (after a warm-up), and
// the process's CPU time over the three.
absl::StatusOr<LinkFigures> MeasureLink(comm::Communicator& c, const Device& device, absl::Duration timeout);

struct ComputeFigures {
  // FLOP/s of one block's forward and backward, counted as the planner
  // counts them (model::BlockFlopsPerToken), in wall time: what a rank's
  // compute reaches on the cores it shares.
  double flops = 0;
  // The process's CPU seconds per wall second meanwhile: the share of the
  // cores the rank computes on (about cores / ranks where ranks outnumber
  // them, the intra-op threads it keeps busy otherwise).
  double core_share = 0;
};

// Times a block of `config`'s model on random weights in its parameter dtype:
// one forward and backward to warm up, then two timed, at a micro-batch's
// tokens or fewer (at most kComputeFlopsPerCall a call). {} (not measured)
// on a CUDA device (not yet run on one) and for a block of more than
// kMaxMeasuredBlockParams parameters (the weights and their gradients would
// be allocated beside the job's).
inline constexpr double kComputeFlopsPerCall = 2e10;
inline constexpr double kMaxMeasuredBlockParams = 5e7;
absl::StatusOr<ComputeFigures> MeasureCompute(const JobConfig& config, const Device& device);

// What strategy = "auto" plans on, as a rank reports it (RankConnected);
// 0 where not measured.
struct AutoFigures {
  double bus_bandwidth = 0;  // bytes/s per rank
  double compute_flops = 0;  // ComputeFigures::flops
  // Seconds of the rank's compute each byte it sends costs: the link's CPU
  // per byte over the rank's share of the cores (ClusterSpec's).
  double comm_cpu_s_per_byte = 0;
};

// MeasureLink over `c`, its bandwidth times `flows` (the flows of `c`'s kind
// that share a host's link at once), and where the transport runs on the
// host's cores, MeasureCompute, every rank at once.
absl::StatusOr<AutoFigures> MeasureAutoFigures(comm::Communicator& c, int flows, const JobConfig& config,
                                               const Device& device, absl::Duration timeout);

// How fast each rank sends, as this rank sees it: after a barrier, rank r
// broadcasts 1 MiB, for each r in turn, and this rank times each. A host
// whose link is slow makes its own broadcast slow for every rank (the
// coordinator names it: a straggler by its link, not its compute).
absl::StatusOr<std::vector<double>> MeasureSendSeconds(comm::Communicator& c, const Device& device,
                                                       absl::Duration timeout);

}  // namespace shardline
