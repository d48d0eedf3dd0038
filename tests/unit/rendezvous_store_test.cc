// RendezvousStore alone: who may touch which keys, the per-job bounds that
// keep one job from starving another, and how waits end.
#include "server/rendezvous_store.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardline {
namespace {

// A wait's outcome, recorded.
struct Answer {
  bool called = false;
  absl::Status status;
  std::vector<std::string> values;
  RendezvousStore::DoneCallback Callback() {
    return [this](const absl::Status& s, const std::vector<std::string>& v) {
      called = true;
      status = s;
      values = v;
    };
  }
};

TEST(RendezvousStore, ACredentialOpensOnlyItsOwnJobsKeys) {
  RendezvousStore store;
  store.Grant("cred-1", "job-1");
  EXPECT_TRUE(store.Authorize("cred-1", {"job-1/rank0", "job-1/nccl/id"}).ok());
  // "job-10/" starts with "job-1": the namespace is the id and its slash.
  EXPECT_EQ(store.Authorize("cred-1", {"job-1/a", "job-10/a"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store.Authorize("cred-1", {"job-1"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store.Authorize("", {"job-1/a"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store.Authorize("cred-2", {"job-1/a"}).code(), absl::StatusCode::kPermissionDenied);
  store.Revoke("cred-1");
  EXPECT_EQ(store.Authorize("cred-1", {"job-1/a"}).code(), absl::StatusCode::kPermissionDenied);
}

TEST(RendezvousStore, OneJobAtItsKeyLimitDoesNotStopAnother) {
  RendezvousStore store;
  for (size_t i = 0; i < RendezvousStore::kMaxJobKeys; ++i) {
    ASSERT_TRUE(store.Set(absl::StrCat("job-a/", i), "v").ok()) << i;
  }
  absl::Status full = store.Set("job-a/one-more", "v");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(), absl::StrCat("store: job-a already set the limit of ", RendezvousStore::kMaxJobKeys, " keys"));
  EXPECT_TRUE(store.Set("job-a/0", "replaced").ok());  // not a new key
  EXPECT_EQ(*store.Get("job-a/0"), "replaced");
  EXPECT_TRUE(store.Set("job-b/0", "v").ok());
  // A key freed is a key the job may set again.
  EXPECT_TRUE(store.Delete("job-a/1"));
  EXPECT_TRUE(store.Set("job-a/one-more", "v").ok());
}

TEST(RendezvousStore, BytesAreCountedOnOverwriteAndDelete) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("job-1/k", std::string(100, 'x')).ok());
  EXPECT_EQ(store.bytes(), 7u + 100u);
  ASSERT_TRUE(store.Set("job-1/k", "y").ok());
  EXPECT_EQ(store.bytes(), 7u + 1u);
  EXPECT_TRUE(store.Delete("job-1/k"));
  EXPECT_FALSE(store.Delete("job-1/k"));
  EXPECT_EQ(store.bytes(), 0u);
  EXPECT_EQ(store.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set(std::string(RendezvousStore::kMaxKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("job-1/big", std::string(RendezvousStore::kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kResourceExhausted);
  // A job's bytes: eight values of 1 MiB pass its 8 MiB with their keys.
  absl::Status s;
  int set = 0;
  for (; set < 9 && s.ok(); ++set) s = store.Set(absl::StrCat("job-1/", set), std::string(1 << 20, 'v'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(set, 8);  // the eighth value would pass it
  EXPECT_TRUE(store.Set("job-2/0", std::string(1 << 20, 'v')).ok());
}

TEST(RendezvousStore, AddCountsAndRefusesOverflowWithoutChangingTheValue) {
  RendezvousStore store;
  EXPECT_EQ(*store.Add("job-1/c", 2), 2);
  EXPECT_EQ(*store.Add("job-1/c", -5), -3);
  ASSERT_TRUE(store.Set("job-1/c", std::to_string(INT64_MAX - 1)).ok());
  EXPECT_EQ(store.Add("job-1/c", 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*store.Get("job-1/c"), std::to_string(INT64_MAX - 1));
  EXPECT_EQ(store.Get("job-1/none").status().code(), absl::StatusCode::kNotFound);
}

TEST(RendezvousStore, AWaitEndsWhenItsLastKeyIsSetWithValuesInItsOrder) {
  RendezvousStore store;
  Answer a;
  store.Wait({"job-1/b", "job-1/a"}, absl::InfiniteFuture(), a.Callback());
  ASSERT_TRUE(store.Set("job-1/a", "A").ok());
  EXPECT_FALSE(a.called);
  ASSERT_TRUE(store.Set("job-1/b", "B").ok());
  ASSERT_TRUE(a.called);
  EXPECT_TRUE(a.status.ok());
  EXPECT_EQ(a.values, (std::vector<std::string>{"B", "A"}));
  EXPECT_EQ(store.waits(), 0u);
  EXPECT_TRUE(store.Check({"job-1/a", "job-1/b"}));
  EXPECT_FALSE(store.Check({"job-1/a", "job-1/c"}));
}

TEST(RendezvousStore, WaitsExpireAtTheirDeadlineOrWhenTheCallerGaveUp) {
  RendezvousStore store;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Answer late, gone, kept;
  bool cancelled = false;
  store.Wait({"job-1/x"}, t0 + absl::Seconds(1), late.Callback());
  store.Wait({"job-1/y"}, t0 + absl::Seconds(60), gone.Callback(), [&] { return cancelled; });
  store.Wait({"job-1/z"}, t0 + absl::Seconds(60), kept.Callback());
  store.ExpireWaits(t0 + absl::Milliseconds(999));
  EXPECT_FALSE(late.called);
  store.ExpireWaits(t0 + absl::Seconds(1));
  EXPECT_EQ(late.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(gone.called);
  cancelled = true;
  store.ExpireWaits(t0 + absl::Seconds(2));
  EXPECT_EQ(gone.status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(kept.called);
  EXPECT_EQ(store.waits(), 1u);
}

TEST(RendezvousStore, DroppingAJobEndsOnlyItsKeysAndWaits) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("job-1/a", "1").ok());
  ASSERT_TRUE(store.Set("job-10/a", "10").ok());
  Answer mine, other;
  store.Wait({"job-1/b"}, absl::InfiniteFuture(), mine.Callback());
  store.Wait({"job-10/b"}, absl::InfiniteFuture(), other.Callback());
  store.DropJob("job-1");
  EXPECT_EQ(mine.status.code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(other.called);
  EXPECT_EQ(store.Get("job-1/a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get("job-10/a").value_or("(gone)"), "10");
  EXPECT_EQ(store.bytes(), std::string("job-10/a10").size());
}

TEST(RendezvousStore, OneJobsWaitsAreBoundedApartFromAnothers) {
  RendezvousStore store;
  std::vector<Answer> answers(RendezvousStore::kMaxJobWaiters + 2);
  for (size_t i = 0; i < RendezvousStore::kMaxJobWaiters; ++i) {
    store.Wait({"job-a/k"}, absl::InfiniteFuture(), answers[i].Callback());
  }
  Answer& refused = answers[RendezvousStore::kMaxJobWaiters];
  store.Wait({"job-a/k"}, absl::InfiniteFuture(), refused.Callback());
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  Answer& other = answers[RendezvousStore::kMaxJobWaiters + 1];
  store.Wait({"job-b/k"}, absl::InfiniteFuture(), other.Callback());
  EXPECT_FALSE(other.called);
  // Answered waits give their places back.
  ASSERT_TRUE(store.Set("job-a/k", "v").ok());
  EXPECT_EQ(store.waits(), 1u);
  Answer again;
  store.Wait({"job-a/j"}, absl::InfiniteFuture(), again.Callback());
  EXPECT_FALSE(again.called);
  std::vector<std::string> many(RendezvousStore::kMaxWaitKeys + 1, "job-c/k");
  Answer wide;
  store.Wait(many, absl::InfiniteFuture(), wide.Callback());
  EXPECT_EQ(wide.status.code(), absl::StatusCode::kResourceExhausted);
}

TEST(RendezvousStore, ShutdownAnswersEveryWaitAndRefusesNewOnes) {
  RendezvousStore store;
  Answer pending, after;
  store.Wait({"job-1/a"}, absl::InfiniteFuture(), pending.Callback());
  store.Shutdown();
  EXPECT_EQ(pending.status.code(), absl::StatusCode::kUnavailable);
  store.Wait({"job-1/a"}, absl::InfiniteFuture(), after.Callback());
  EXPECT_EQ(after.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store.waits(), 0u);
}

}  // namespace
}  // namespace shardline
