// NcclCommunicator on a real GPU: one rank, every collective, results checked
// on the host. Exits 77 (ctest: skipped) where no CUDA device exists.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "worker/comm/nccl_communicator.h"

namespace shardline::comm {
namespace {

at::Tensor DeviceFloats(std::vector<float> host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(float)), cudaSuccess);
  cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  return at::from_blob(p, {static_cast<int64_t>(host.size())}, [](void* q) { cudaFree(q); },
                       at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));
}
std::vector<float> Host(const at::Tensor& t) {
  std::vector<float> h(t.numel());
  cudaMemcpy(h.data(), t.data_ptr(), h.size() * sizeof(float), cudaMemcpyDeviceToHost);
  return h;
}

TEST(Nccl, OneRankCollectivesComplete) {
  auto c = CreateNcclCommunicator(c10::make_intrusive<c10d::HashStore>(), "g/", 0, 1, NcclOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  at::Tensor in = DeviceFloats({1, 2, 3}), out = DeviceFloats({0, 0, 0});
  ASSERT_TRUE((*c)->AllGather(out, in)->Wait(absl::Seconds(30)).ok());
  cudaDeviceSynchronize();
  EXPECT_EQ(Host(out), (std::vector<float>{1, 2, 3}));
  at::Tensor ar = DeviceFloats({4, 5});
  ASSERT_TRUE((*c)->AllReduce(ar)->Wait(absl::Seconds(30)).ok());
  ASSERT_TRUE((*c)->ReduceScatter(out, in)->Wait(absl::Seconds(30)).ok());
  ASSERT_TRUE((*c)->Barrier()->Wait(absl::Seconds(30)).ok());
  cudaDeviceSynchronize();
  EXPECT_EQ(Host(ar), (std::vector<float>{4, 5}));
  EXPECT_EQ((*c)->Stats().last_completed_seq, 4);
  EXPECT_GT((*c)->Stats().of(Op::kAllGather).seconds, 0);
}

}  // namespace
}  // namespace shardline::comm

int main(int argc, char** argv) {
  if (!shardline::comm::CudaDeviceAvailable()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
