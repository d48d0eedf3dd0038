// Device: where one rank computes (docs/design.md, "Devices and streams"), its
// streams named by role, and the one place the engine allocates.
//
//   compute          forward, backward, the optimizer; current on the step thread
//   all_gather       parameter all-gathers (and broadcasts)
//   reduce_scatter   gradient reduce-scatters (and all-reduces)
//
// On `cpu` every stream is the CPU's one stream, waits are no-ops and memory
// is TensorMemory's (which caches large blocks, as CUDA's allocator does). On
// `cuda:N` the streams come from LibTorch's CUDA stream pool, allocation goes
// through the CUDA caching allocator on the compute stream, and memory comes
// from that allocator's statistics.
//
// Errors: Open refuses a malformed spec, `cuda` in a build without CUDA, and
// a device index that is not visible, each naming the device.
// Threading: immutable after Open; any thread may read it. A ComputeScope
// sets the current device and stream of the thread that holds it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardline {

enum class StreamRole { kCompute = 0, kAllGather, kReduceScatter };
constexpr int kNumStreamRoles = 3;

// Bytes of tensor memory: what live tensors hold (allocated), what the
// allocator keeps from the system (reserved; equals allocated on CPU), and
// the peaks of both since the last ResetPeakMemory.
struct DeviceMemory {
  int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
};

// The number of CUDA devices this process sees (0 without CUDA or a driver).
int CudaDeviceCount();

// Loads LibTorch's CUDA kernels (libtorch_cuda, beside libtorch_cpu) into the
// process once; PrepareDevice and Device::Open call it for a CUDA device.
// Needs no GPU.
absl::Status LoadLibTorchCuda();

// What a program that computes on `spec` calls first thing in main, before
// any other ATen call: refuses a malformed spec, a CUDA device in a build
// without CUDA, and a CUDA index this process does not see (naming the
// device and how many it sees), and for CUDA loads libtorch_cuda. Order
// matters: ATen looks up its CUDA hooks once per process, at the first
// question about CUDA (a backward, at::hasCUDA(), is_pinned), and a lookup
// made before libtorch_cuda is loaded leaves CUDA off for good, so the first
// CUDA allocation fails. A device lost or busy later fails the job that
// opens it (Device::Open), not the program.
absl::Status PrepareDevice(const std::string& spec);

class Device {
 public:
  // "cpu", "cuda" (cuda:0) or "cuda:N".
  static absl::StatusOr<std::shared_ptr<const Device>> Open(const std::string& spec);

  const at::Device& device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  std::string name() const { return device_.str(); }
  c10::Stream stream(StreamRole role) const { return streams_[static_cast<int>(role)]; }

  // The one place the engine allocates: uninitialised or zeroed, 1-D, on this
  // device (the compute stream's pool where there are streams).
  at::Tensor Empty(int64_t numel, at::ScalarType dtype) const;
  at::Tensor Zeros(int64_t numel, at::ScalarType dtype) const;
  // A host tensor moved here (a copy on the compute stream; as is on CPU).
  at::Tensor FromHost(const at::Tensor& host) const;

  // Makes the compute stream (and this device) current on the calling
  // thread while it lives; the engine's step thread holds one.
  class ComputeScope {
   public:
    explicit ComputeScope(const Device& d);
   private:
    std::optional<c10::StreamGuard> guard_;
  };

  // Host wait for everything issued on the compute stream so far, polling
  // with a deadline (a hung kernel is an error naming the device, not a
  // hang). Immediate on CPU.
  absl::Status Synchronize(absl::Duration timeout) const;

  DeviceMemory Memory() const;
  void ResetPeakMemory() const;
  // Returns the allocator's cached, unused blocks to the system, after a
  // one-off peak (loading weights or a checkpoint) that steps never reach.
  void ReleaseCachedMemory() const;

 private:
  explicit Device(at::Device device);

  at::Device device_;
  c10::Stream streams_[kNumStreamRoles];
};

}  // namespace shardline
