// The one reading of a device as workers name it (--device, WorkerInfo.device):
// "cpu", "cuda" (cuda:0) or "cuda:N" with N in [0, 1023]. Whether the device
// exists is the engine's question (worker/device/device.h); this is only the
// text. Pure functions; any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"

namespace shardline {

enum class DeviceKind { kCpu, kCuda };

struct DeviceSpec {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  // of a CUDA device
};

inline absl::StatusOr<DeviceSpec> ParseDeviceSpec(const std::string& spec) {
  if (spec == "cpu") return DeviceSpec{};
  if (spec == "cuda") return DeviceSpec{DeviceKind::kCuda, 0};
  int index = -1;
  if (spec.rfind("cuda:", 0) != 0 || !absl::SimpleAtoi(spec.substr(5), &index) || index < 0 || index > 1023) {
    return absl::InvalidArgumentError(absl::StrCat("device ", Quoted(spec), ": expected cpu, cuda or cuda:N"));
  }
  return DeviceSpec{DeviceKind::kCuda, index};
}

// "cuda" or "cpu": what a job's ranks must share (NCCL and Gloo ranks cannot
// form one group). A spec that does not parse is its own kind, shared with
// no other worker's.
inline std::string DeviceKindName(const std::string& spec) {
  absl::StatusOr<DeviceSpec> d = ParseDeviceSpec(spec);
  if (!d.ok()) return "unknown " + spec;
  return d->kind == DeviceKind::kCuda ? "cuda" : "cpu";
}

}  // namespace shardline
