// The one reading of a device's name (common/job/device_spec.h).
#include "common/job/device_spec.h"

#include "gtest/gtest.h"

namespace shardline {
namespace {

TEST(DeviceSpec, CpuCudaAndCudaNAndNothingElse) {
  EXPECT_EQ(ParseDeviceSpec("cpu")->kind, DeviceKind::kCpu);
  EXPECT_EQ(ParseDeviceSpec("cuda")->index, 0);
  EXPECT_EQ(ParseDeviceSpec("cuda:7")->index, 7);
  EXPECT_EQ(ParseDeviceSpec("cuda:7")->kind, DeviceKind::kCuda);
  for (const char* bad : {"", "gpu0", "cuda:", "cuda:-1", "cuda:1024", "cuda:1x", "CPU", "cuda:99999999999"}) {
    EXPECT_EQ(ParseDeviceSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseDeviceSpec("gpu\n0").status().message(), "device \"gpu\\n0\": expected cpu, cuda or cuda:N");
  // The kind a job's ranks share; a name that does not parse shares none.
  EXPECT_EQ(DeviceKindName("cuda:3"), "cuda");
  EXPECT_EQ(DeviceKindName("cuda"), "cuda");
  EXPECT_EQ(DeviceKindName("cpu"), "cpu");
  EXPECT_NE(DeviceKindName("cudax"), "cuda");
}

}  // namespace
}  // namespace shardline
