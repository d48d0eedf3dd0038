// WorkerRegistry alone: what may register, ids and the version, expiry of
// silent workers, and the census the scheduler places jobs with.
#include "server/worker_registry.h"

#include <gtest/gtest.h>

#include <string>

namespace shardline {
namespace {

v1::WorkerInfo Info(const std::string& host, const std::string& device) {
  v1::WorkerInfo info;
  info.set_host(host);
  info.set_device(device);
  return info;
}

TEST(WorkerRegistry, CheckRefusesWhatCannotBeShownOrDialled) {
  EXPECT_TRUE(WorkerRegistry::Check(Info("host-a", "cpu")).ok());
  EXPECT_EQ(WorkerRegistry::Check(Info("", "cpu")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkerRegistry::Check(Info("h", "")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(WorkerRegistry::Check(Info(std::string(WorkerRegistry::kMaxHostBytes, 'h'), "cpu")).ok());
  EXPECT_EQ(WorkerRegistry::Check(Info(std::string(WorkerRegistry::kMaxHostBytes + 1, 'h'), "cpu")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkerRegistry::Check(Info("h\x1b[2J", "cpu")).code(), absl::StatusCode::kInvalidArgument);
  v1::WorkerInfo caps = Info("h", "cpu");
  for (int i = 0; i <= WorkerRegistry::kMaxCapabilities; ++i) caps.add_capabilities("c");
  EXPECT_EQ(WorkerRegistry::Check(caps).code(), absl::StatusCode::kInvalidArgument);
  v1::WorkerInfo addr = Info("h", "cpu");
  addr.set_collective_address("fd00::1");
  EXPECT_TRUE(WorkerRegistry::Check(addr).ok());
  addr.set_collective_address("evil.example");
  EXPECT_EQ(WorkerRegistry::Check(addr).message(),
            "register: collective_address \"evil.example\" is not an IP address");
}

TEST(WorkerRegistry, AWorkerEntersIdleUnderAFreshIdAndEveryChangeOfMembershipMovesTheVersion) {
  WorkerRegistry reg;
  const uint64_t v0 = reg.version();
  v1::WorkerInfo claim = Info("h", "cpu");
  claim.set_job_id("job-3");
  claim.set_rank(2);
  claim.set_claim_credential("secret");
  WorkerRecord& a = reg.Add(claim, nullptr, absl::FromUnixSeconds(10));
  EXPECT_EQ(a.info.worker_id(), "w-1");
  EXPECT_EQ(a.info.state(), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(a.info.job_id(), "");
  EXPECT_EQ(a.info.rank(), 0);
  EXPECT_EQ(a.info.claim_credential(), "");  // never kept, never listed
  EXPECT_GT(reg.version(), v0);
  const uint64_t v1 = reg.version();
  ASSERT_TRUE(reg.Remove("w-1").has_value());
  EXPECT_GT(reg.version(), v1);
  EXPECT_FALSE(reg.Remove("w-1").has_value());
  // An id is never given twice, even after its worker left.
  EXPECT_EQ(reg.Add(Info("h", "cpu"), nullptr, absl::FromUnixSeconds(10)).info.worker_id(), "w-2");
}

TEST(WorkerRegistry, AWorkerIsSilentOnlyPastTheLimit) {
  WorkerRegistry reg;
  const absl::Time t0 = absl::FromUnixSeconds(100);
  reg.Add(Info("a", "cpu"), nullptr, t0);
  reg.Add(Info("b", "cpu"), nullptr, t0);
  ASSERT_TRUE(reg.Heard("w-2", t0 + absl::Seconds(2)));
  EXPECT_FALSE(reg.Heard("w-9", t0));
  const absl::Duration lost_after = absl::Seconds(3);
  EXPECT_TRUE(reg.Silent(t0 + lost_after, lost_after).empty());  // exactly at the limit: not yet
  EXPECT_EQ(reg.Silent(t0 + lost_after + absl::Milliseconds(1), lost_after), std::vector<std::string>{"w-1"});
  EXPECT_EQ(reg.Silent(t0 + absl::Seconds(10), lost_after), (std::vector<std::string>{"w-1", "w-2"}));
  EXPECT_EQ(reg.List(t0 + absl::Seconds(4))[1].heartbeat_age_seconds(), 2.0);
}

TEST(WorkerRegistry, TheCensusCountsBusyWorkersAsRegisteredButOffersOnlyIdleOnesNotExcluded) {
  WorkerRegistry reg;
  const absl::Time t = absl::FromUnixSeconds(1);
  WorkerRecord& busy = reg.Add(Info("a", "cuda:0"), nullptr, t);
  reg.Add(Info("a", "cuda:1"), nullptr, t);
  reg.Add(Info("b", "cuda:0"), nullptr, t);
  reg.Add(Info("c", "cpu"), nullptr, t);
  WorkerRegistry::Assign(busy, "job-1", 0);
  WorkerRegistry::Census c = reg.Count({"b/cuda:0"});
  EXPECT_EQ(c.registered_by_kind["cuda"], 3);
  EXPECT_EQ(c.registered_by_kind["cpu"], 1);
  ASSERT_EQ(c.idle_by_kind["cuda"].size(), 1u);
  EXPECT_EQ(c.idle_by_kind["cuda"][0]->info.device(), "cuda:1");
  EXPECT_EQ(reg.IdleOfKind("cuda", {}), 2);
  EXPECT_EQ(reg.IdleOfKind("cuda", {"b/cuda:0"}), 1);
  ASSERT_NE(reg.AnyOnJob("job-1"), nullptr);
  EXPECT_EQ(reg.AnyOnJob("job-1")->info.worker_id(), "w-1");
  EXPECT_EQ(reg.AnyOnJob("job-2"), nullptr);
  busy.unproven_claim = "job-7";
  WorkerRegistry::Release(busy);
  EXPECT_EQ(busy.info.state(), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(busy.unproven_claim, "");
  EXPECT_EQ(reg.AnyOnJob("job-1"), nullptr);
  EXPECT_EQ(reg.HostOf("w-3"), "b");
  EXPECT_EQ(reg.HostOf("w-9"), "?");
}

}  // namespace
}  // namespace shardline
