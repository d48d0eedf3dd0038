#include "worker/device/device.h"

#include "common/job/device_spec.h"

#include <dlfcn.h>

#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"
#include "worker/device/tensor_memory.h"

#ifdef SHARDLINE_WITH_CUDA
#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace shardline {

int CudaDeviceCount() {
#ifdef SHARDLINE_WITH_CUDA
  // device_count_ensure_non_zero would throw; device_count() reports 0 where
  // there is no driver or no device.
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (const std::exception&) {
    return 0;
  }
#else
  return 0;
#endif
}

#ifdef SHARDLINE_WITH_CUDA
// LibTorch's CUDA kernels (libtorch_cuda, which loads cuBLAS, cuDNN and the
// rest) are loaded when the process first opens a CUDA device, not at start:
// linked, those libraries take ~190 KB of static TLS in every thread (more
// than a thread with a small stack has), and CPU ranks never need them. Loading registers the CUDA kernels with
// ATen's dispatcher, as `import torch` does. It sits beside libtorch_cpu.
absl::Status LoadLibTorchCuda() {
  static std::once_flag once;
  static absl::Status loaded;
  std::call_once(once, [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) == 0 || info.dli_fname == nullptr) {
      loaded = absl::InternalError("cannot locate libtorch_cpu to load libtorch_cuda beside it");
      return;
    }
    std::string dir = info.dli_fname;
    dir = dir.substr(0, dir.rfind('/') + 1);
    const std::string path = dir + "libtorch_cuda.so";
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      loaded = absl::FailedPreconditionError(absl::StrCat("cannot load ", path, ": ", dlerror()));
    }
  });
  return loaded;
}
#else
absl::Status LoadLibTorchCuda() { return absl::FailedPreconditionError("this build has no CUDA"); }
#endif

namespace {

c10::Stream DefaultStream(const at::Device& d) { return c10::Stream(c10::Stream::DEFAULT, d); }

absl::StatusOr<at::Device> ParseDevice(const std::string& spec) {
  absl::StatusOr<DeviceSpec> parsed = ParseDeviceSpec(spec);
  if (!parsed.ok()) return parsed.status();
  if (parsed->kind == DeviceKind::kCpu) return at::Device(at::kCPU);
  [[maybe_unused]] const int index = parsed->index;
#ifndef SHARDLINE_WITH_CUDA
  return absl::FailedPreconditionError(absl::StrCat("device ", spec, ": this build has no CUDA"));
#else
  // The count comes from c10's CUDA runtime, not from ATen's hooks, so asking
  // it first leaves CUDA usable; libtorch_cuda is loaded before anything asks
  // ATen (PrepareDevice's header says why), and ATen must then agree.
  const int n = CudaDeviceCount();
  auto not_visible = [&] {
    return absl::FailedPreconditionError(absl::StrCat("device ", spec, ": not visible (this process sees ", n,
                                                      " CUDA device", n == 1 ? "" : "s", ")"));
  };
  if (index >= n) return not_visible();
  if (absl::Status s = LoadLibTorchCuda(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("device ", spec, ": ", s.message()));
  }
  if (!at::hasCUDA()) return not_visible();
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
#endif
}

}  // namespace

absl::Status PrepareDevice(const std::string& spec) { return ParseDevice(spec).status(); }

Device::Device(at::Device device)
    : device_(device), streams_{DefaultStream(device), DefaultStream(device), DefaultStream(device)} {}

absl::StatusOr<std::shared_ptr<const Device>> Device::Open(const std::string& spec) {
  auto parsed = ParseDevice(spec);
  if (!parsed.ok()) return parsed.status();
  std::shared_ptr<Device> d(new Device(*parsed));
#ifdef SHARDLINE_WITH_CUDA
  if (d->is_cuda()) {
    try {
      // Communication streams get high priority, as FSDP2's do, so that a
      // collective is not queued behind compute kernels.
      const c10::DeviceIndex i = d->device_.index();
      d->streams_[static_cast<int>(StreamRole::kCompute)] = c10::cuda::getStreamFromPool(false, i);
      d->streams_[static_cast<int>(StreamRole::kAllGather)] = c10::cuda::getStreamFromPool(true, i);
      d->streams_[static_cast<int>(StreamRole::kReduceScatter)] = c10::cuda::getStreamFromPool(true, i);
    } catch (const std::exception& e) {
      std::string what = e.what();
      return absl::UnavailableError(absl::StrCat("device ", spec, ": ", what.substr(0, what.find('\n'))));
    }
  }
#endif
  return std::shared_ptr<const Device>(std::move(d));
}

at::Tensor Device::Empty(int64_t numel, at::ScalarType dtype) const {
  ComputeScope scope(*this);
  return at::empty({numel}, at::TensorOptions().dtype(dtype).device(device_));
}

at::Tensor Device::Zeros(int64_t numel, at::ScalarType dtype) const {
  // One scope for both: the fill must be ordered on the compute stream too,
  // like every other use of the buffer.
  ComputeScope scope(*this);
  return at::zeros({numel}, at::TensorOptions().dtype(dtype).device(device_));
}

at::Tensor Device::FromHost(const at::Tensor& host) const {
  if (!is_cuda()) return host;
  ComputeScope scope(*this);
  return host.to(device_);
}

Device::ComputeScope::ComputeScope(const Device& d) {
  if (d.is_cuda()) guard_.emplace(d.stream(StreamRole::kCompute));
}

absl::Status Device::Synchronize(absl::Duration timeout) const {
#ifdef SHARDLINE_WITH_CUDA
  if (!is_cuda()) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  try {
    c10::Event done(c10::DeviceType::CUDA);
    done.record(stream(StreamRole::kCompute));
    // Polled rather than cudaEventSynchronize: a kernel that never ends (a
    // collective whose peer died before the watchdog aborted it) must not
    // hold the step thread past its deadline.
    while (!done.query()) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(name(), ": the compute stream did not finish within ",
                                                        absl::FormatDuration(timeout)));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InternalError(absl::StrCat(name(), ": ", what.substr(0, what.find('\n'))));
  }
#else
  (void)timeout;
#endif
  return absl::OkStatus();
}

DeviceMemory Device::Memory() const {
  DeviceMemory m;
#ifdef SHARDLINE_WITH_CUDA
  if (is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m.allocated = stats.allocated_bytes[kAll].current;
    m.peak_allocated = stats.allocated_bytes[kAll].peak;
    m.reserved = stats.reserved_bytes[kAll].current;
    m.peak_reserved = stats.reserved_bytes[kAll].peak;
    return m;
  }
#endif
  m.allocated = TensorMemory::current();
  m.peak_allocated = TensorMemory::peak();
  m.reserved = TensorMemory::reserved();
  m.peak_reserved = TensorMemory::peak_reserved();
  return m;
}

void Device::ReleaseCachedMemory() const {
#ifdef SHARDLINE_WITH_CUDA
  if (is_cuda()) {
    c10::cuda::CUDACachingAllocator::emptyCache();
    return;
  }
#endif
  TensorMemory::ReleaseCached();
}

void Device::ResetPeakMemory() const {
#ifdef SHARDLINE_WITH_CUDA
  if (is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
    return;
  }
#endif
  TensorMemory::ResetPeak();
}

}  // namespace shardline
