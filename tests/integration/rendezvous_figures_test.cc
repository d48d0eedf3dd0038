// What a rank measures at its rendezvous for strategy = "auto", over a Gloo
// group of two ranks on threads: the link, the CPU its bytes cost, and a
// block's compute; a block past the bound is not timed.
#include "worker/run/rendezvous_figures.h"

#include <gtest/gtest.h>

#include "gloo_ranks.h"

namespace shardline {
namespace {

JobConfig SmallGpt() {
  JobConfig c;
  c.model.n_layer = 2;
  c.model.n_head = 4;
  c.model.n_embd = 128;
  c.model.vocab_size = 512;
  c.model.block_size = 64;
  c.train.micro_batch_size = 2;
  return c;
}

TEST(RendezvousFigures, TwoRanksMeasureTheLinkTheCpuItsBytesCostAndABlocksCompute) {
  std::shared_ptr<const Device> cpu = *Device::Open("cpu");
  comm::OnRanks(2, comm::GlooOptions{}, [&](int, comm::Communicator& c) {
    absl::StatusOr<AutoFigures> f = MeasureAutoFigures(c, 1, SmallGpt(), *cpu, absl::Seconds(60));
    ASSERT_TRUE(f.ok()) << f.status();
    // Loopback moves GB/s; a loaded VM at least 10 MB/s.
    EXPECT_GT(f->bus_bandwidth, 1e7);
    EXPECT_LT(f->bus_bandwidth, 3e12);
    // TCP's copies and checksums: a byte costs the cores nanoseconds, not
    // picoseconds or microseconds (both ranks share this process's clock,
    // and a share of the cores below one rank's divides it).
    EXPECT_GT(f->comm_cpu_s_per_byte, 1e-12);
    EXPECT_LT(f->comm_cpu_s_per_byte, 1e-6);
    // A thread reaches MFLOP/s to TFLOP/s on any CPU.
    EXPECT_GT(f->compute_flops, 1e7);
    EXPECT_LT(f->compute_flops, 1e13);
  });
}

TEST(RendezvousFigures, ABlockPastTheBoundIsNotTimed) {
  std::shared_ptr<const Device> cpu = *Device::Open("cpu");
  JobConfig big = SmallGpt();
  big.model.n_embd = 4096;  // 12 x 4096^2 = 201M a block
  big.model.n_head = 32;
  absl::StatusOr<ComputeFigures> f = MeasureCompute(big, *cpu);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->flops, 0);
  EXPECT_EQ(f->core_share, 0);
  absl::StatusOr<ComputeFigures> small = MeasureCompute(SmallGpt(), *cpu);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_GT(small->flops, 0);
  EXPECT_GT(small->core_share, 0);
}

}  // namespace
}  // namespace shardline
