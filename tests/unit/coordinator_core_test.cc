// CoordinatorCore without a network: registry, FIFO scheduling with stable
// ranks, the job state machine, lost workers, the store's waits, recovery.
#include "server/coordinator_core.h"
#include "tests/unit/core_fixture.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/state/job_state.h"

namespace shardline {
namespace {

using namespace testing_core;  // NOLINT: the fixture's names

TEST_F(CoreTest, AJobNeverMixesCpuAndCudaWorkers) {
  RecordingChannel gpu, cpu1, cpu2;
  AddWorker("a", "cuda:0", &gpu);
  AddWorker("a", "cpu", &cpu1);
  const std::string job = Submit(2);
  EXPECT_EQ(State(job), "PENDING");
  EXPECT_NE(core_->GetJob(job)->message().find("one device kind (registered: 1 cpu, 1 cuda)"), std::string::npos)
      << core_->GetJob(job)->message();
  EXPECT_TRUE(gpu.Starts().empty());
  AddWorker("b", "cpu", &cpu2);
  EXPECT_EQ(State(job), "RUNNING");
  EXPECT_TRUE(gpu.Starts().empty());
  EXPECT_EQ(cpu1.Starts().size() + cpu2.Starts().size(), 2u);
}

TEST_F(CoreTest, JobWaitsForWorkersThenRanksFollowHostAndDevice) {
  RecordingChannel a, b, c;
  const std::string wb = AddWorker("host-b", "cuda:0", &b);
  const std::string job = Submit(3);
  EXPECT_EQ(State(job), "PENDING");
  const std::string wa = AddWorker("host-a", "cuda:1", &a);
  EXPECT_EQ(State(job), "PENDING");
  const std::string wc = AddWorker("host-a", "cuda:0", &c);  // the third arrives: the job starts
  EXPECT_EQ(State(job), "RUNNING");
  ASSERT_EQ(a.Starts().size(), 1u);
  EXPECT_EQ(c.Starts()[0].rank(), 0);  // host-a cuda:0
  EXPECT_EQ(a.Starts()[0].rank(), 1);  // host-a cuda:1
  EXPECT_EQ(b.Starts()[0].rank(), 2);  // host-b
  EXPECT_EQ(b.Starts()[0].world_size(), 3);
  Finish(wc, job, 0, true);
  Finish(wa, job, 1, true);
  EXPECT_EQ(State(job), "RUNNING");
  Finish(wb, job, 2, true);
  EXPECT_EQ(State(job), "SUCCEEDED");
}

TEST_F(CoreTest, QueueIsFifo) {
  RecordingChannel a, b;
  const std::string wa = AddWorker("h1", "cpu", &a);
  const std::string running = Submit(1);
  AddWorker("h2", "cpu", &b);
  const std::string first = Submit(2);
  const std::string second = Submit(1);
  // One idle worker would fit the second job, but it must not overtake a
  // job that waits for a busy worker.
  EXPECT_EQ(State(first), "PENDING");
  EXPECT_EQ(State(second), "PENDING");
  Finish(wa, running, 0, true);
  EXPECT_EQ(State(first), "RUNNING");
  EXPECT_EQ(State(second), "PENDING");
}

TEST_F(CoreTest, AJobThatCannotFitDoesNotHoldTheQueue) {
  RecordingChannel a, b, c;
  const std::string wa = AddWorker("h1", "cpu", &a);
  const std::string huge = Submit(3);    // more than are registered
  const std::string small = Submit(1);   // starts behind it
  EXPECT_EQ(State(huge), "PENDING");
  EXPECT_NE(core_->GetJob(huge)->message().find("waiting for 3 workers of one device kind (registered: 1 cpu)"),
            std::string::npos)
      << core_->GetJob(huge)->message();
  EXPECT_EQ(State(small), "RUNNING");
  // Once enough are registered it waits for idle ones, first in line again.
  AddWorker("h2", "cpu", &b);
  AddWorker("h3", "cpu", &c);
  const std::string later = Submit(1);
  EXPECT_EQ(State(huge), "PENDING");
  EXPECT_EQ(State(later), "PENDING");  // FIFO behind a job that fits the cluster
  Finish(wa, small, 0, true);
  EXPECT_EQ(State(huge), "RUNNING");
  EXPECT_EQ(State(later), "PENDING");
}

TEST_F(CoreTest, DeleteForgetsAnEndedJobAndItsIdIsNeverGivenAgain) {
  RecordingChannel a;
  const std::string w = AddWorker("h", "cpu", &a);
  v1::SubmitJobRequest req;
  req.set_spec_toml(kSpec);
  req.set_workers(1);
  req.set_base_dir(dir_);  // its checkpoints go under the test's directory
  const std::string job = *core_->Submit(req);
  EXPECT_EQ(core_->Delete(job, false).status().code(), absl::StatusCode::kFailedPrecondition);  // running
  ASSERT_TRUE(core_->Cancel(job).ok());
  // Its worker has not reported back yet: it may still write into the job's directory.
  EXPECT_EQ(core_->Delete(job, false).status().code(), absl::StatusCode::kFailedPrecondition);
  Finish(w, job, 0, false, "stopped", absl::StatusCode::kCancelled);
  const std::string root = core_->GetJob(job)->checkpoint_root();
  std::filesystem::create_directories(root + "/step-00000002");
  std::ofstream(root + "/step-00000002/rank-00000.safetensors") << "partial";
  ASSERT_TRUE(core_->Delete(job, true).ok());
  EXPECT_EQ(core_->GetJob(job).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(root));  // an interrupted save too, then the empty directory
  core_.reset();
  CoordinatorCore restarted(store_.get(), CoordinatorOptions{});
  ASSERT_TRUE(restarted.Recover().ok());
  EXPECT_EQ(restarted.GetJob(job).status().code(), absl::StatusCode::kNotFound);
  v1::SubmitJobRequest r;
  r.set_spec_toml(kSpec);
  r.set_workers(1);
  EXPECT_EQ(*restarted.Submit(r), "job-2");  // not job-1 again: it would write into job-1's directory
}

TEST_F(CoreTest, EndedJobsBeyondTheCountOrAgeAreForgottenOldestFirst) {
  CoordinatorOptions options{absl::Milliseconds(100), 3, absl::Milliseconds(50), absl::Milliseconds(50)};
  options.keep_finished_jobs = 2;
  options.keep_finished_for = absl::Hours(1);
  core_ = std::make_unique<CoordinatorCore>(store_.get(), options);
  std::vector<std::string> jobs;
  for (int i = 0; i < 4; ++i) {
    jobs.push_back(Submit(1));
    ASSERT_TRUE(core_->Cancel(jobs.back()).ok());
    absl::SleepFor(absl::Milliseconds(2));  // distinct end times
  }
  const std::string pending = Submit(1);
  core_->Tick(absl::Now());
  EXPECT_FALSE(core_->GetJob(jobs[0]).ok());
  EXPECT_FALSE(core_->GetJob(jobs[1]).ok());
  EXPECT_TRUE(core_->GetJob(jobs[2]).ok());
  EXPECT_TRUE(core_->GetJob(jobs[3]).ok());
  core_->Tick(absl::Now() + absl::Hours(2));  // past the age: every ended job goes, never a pending one
  EXPECT_FALSE(core_->GetJob(jobs[3]).ok());
  EXPECT_EQ(State(pending), "PENDING");
}

TEST_F(CoreTest, FailedRankFailsTheJobAndStopsTheOthers) {
  RecordingChannel a, b;
  const std::string wa = AddWorker("h1", "cpu", &a);
  AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  Finish(wa, job, 0, false, "boom");
  EXPECT_EQ(State(job), "RUNNING");  // held for the grace period
  core_->Tick(absl::Now() + absl::Milliseconds(150));  // past the grace, within heartbeats
  auto j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(j.message().find("rank 0 on host h1 failed: boom"), std::string::npos) << j.message();
  EXPECT_EQ(b.Cancels(), 1);
}

TEST_F(CoreTest, ALostWorkerIsTheRootCauseOverARankThatNoticedIt) {
  RecordingChannel a, b;
  const std::string wa = AddWorker("h1", "cpu", &a);
  const std::string wb = AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  // Rank 0's collective fails first because rank 1's process died...
  Finish(wa, job, 0, false, "all_gather #7: connection closed by rank 1");
  // ...and only then is rank 1's session seen to drop.
  core_->WorkerGone(wb, "session closed");
  auto j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.message().rfind("worker lost: rank 1 on host h2", 0), 0u) << j.message();
  EXPECT_NE(j.message().find("all_gather #7"), std::string::npos) << j.message();
}

TEST_F(CoreTest, ARanksOwnErrorIsTheRootCauseOverItsPeersConnectionErrors) {
  RecordingChannel a, b, c;
  const std::string wa = AddWorker("h1", "cpu", &a);
  const std::string wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  const std::string job = Submit(3);
  // Rank 0 stopped on a bad shard; its peers' collectives fail and one of
  // them reports first.
  Finish(wb, job, 1, false, "all_gather #3: connection closed by rank 0", absl::StatusCode::kUnavailable);
  EXPECT_EQ(State(job), "RUNNING");  // a peer's error waits for the root cause
  Finish(wa, job, 0, false, "rank-00000.safetensors: checksum mismatch", absl::StatusCode::kDataLoss);
  auto j = *core_->GetJob(job);  // at once: no grace for a rank's own error
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.message(), "rank 0 on host h1 failed: rank-00000.safetensors: checksum mismatch");
  EXPECT_EQ(c.Cancels(), 1);
  // Later reports change nothing.
  Finish(wc, job, 2, false, "reduce_scatter #3 timed out", absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(core_->GetJob(job)->message(), j.message());
}

TEST_F(CoreTest, LostWorkerFailsTheJobNamingRankAndHost) {
  RecordingChannel a, b;
  AddWorker("h1", "cpu", &a);
  const std::string wb = AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  core_->WorkerGone(wb, "session closed");
  auto j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(j.message().find("rank 1 on host h2"), std::string::npos) << j.message();
  EXPECT_EQ(a.Cancels(), 1);
  EXPECT_EQ(core_->ListWorkers().size(), 1u);
}

TEST_F(CoreTest, SilentWorkerIsLostAfterThreeHeartbeats) {
  RecordingChannel a;
  AddWorker("h1", "cpu", &a);
  core_->Tick(absl::Now() + absl::Milliseconds(250));
  EXPECT_EQ(core_->ListWorkers().size(), 1u);
  core_->Tick(absl::Now() + absl::Milliseconds(400));
  EXPECT_EQ(core_->ListWorkers().size(), 0u);
  EXPECT_FALSE(a.closed.ok());
}

TEST_F(CoreTest, CancelRunningAndFinalJobs) {
  RecordingChannel a;
  const std::string wa = AddWorker("h", "cpu", &a);
  const std::string job = Submit(1);
  EXPECT_EQ(core_->Cancel(job)->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(a.Cancels(), 1);
  auto again = core_->Cancel(job);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  // The worker reports that it stopped and is idle again.
  v1::RankFinished f;
  f.set_job_id(job);
  f.set_cancelled(true);
  core_->OnFinished(wa, f);
  EXPECT_EQ(core_->ListWorkers()[0].state(), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(State(job), "CANCELLED");
}

TEST_F(CoreTest, BadSpecIsRejectedNamingTheKey) {
  v1::SubmitJobRequest r;
  r.set_spec_toml(std::string(kSpec) + "[optimizer]\nlr = \"fast\"\n");
  r.set_source("job.toml");
  auto id = core_->Submit(r);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("job.toml: [optimizer] lr must be a number"), std::string::npos);
  EXPECT_TRUE(core_->ListJobs().empty());
}

TEST_F(CoreTest, StoreWaitsCompleteOrTimeOut) {
  std::vector<std::string> got;
  absl::Status done = absl::UnknownError("pending");
  core_->StoreWait({"a", "b"}, absl::Now() + absl::Seconds(10),
                   [&](const absl::Status& s, const std::vector<std::string>& v) {
                     done = s;
                     got = v;
                   });
  ASSERT_TRUE(core_->StoreSet("a", "1").ok());
  EXPECT_EQ(done.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(*core_->StoreAdd("b", 5), 5);
  EXPECT_TRUE(done.ok());
  EXPECT_EQ(got, (std::vector<std::string>{"1", "5"}));
  absl::Status late = absl::OkStatus();
  core_->StoreWait({"never"}, absl::Now() + absl::Milliseconds(1),
                   [&](const absl::Status& s, const std::vector<std::string>&) { late = s; });
  core_->Tick(absl::Now() + absl::Milliseconds(5));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoreTest, ACancelledWaitIsFreedAtTheNextTickAndShutdownAnswersEveryWait) {
  bool gone = false;
  absl::Status cancelled = absl::UnknownError("pending"), other = absl::UnknownError("pending");
  core_->StoreWait({"job-1/x"}, absl::Now() + absl::Hours(1),
                   [&](const absl::Status& s, const std::vector<std::string>&) { cancelled = s; }, [&] { return gone; });
  core_->StoreWait({"job-1/y"}, absl::Now() + absl::Hours(1),
                   [&](const absl::Status& s, const std::vector<std::string>&) { other = s; }, [] { return false; });
  core_->Tick(absl::Now());
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kUnknown);
  gone = true;  // the client went away: freed now, not in an hour
  core_->Tick(absl::Now());
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(other.code(), absl::StatusCode::kUnknown);
  core_->Shutdown();  // the server's shutdown must not wait out an hour
  EXPECT_EQ(other.code(), absl::StatusCode::kUnavailable);
  absl::Status after = absl::OkStatus();
  core_->StoreWait({"job-1/z"}, absl::Now() + absl::Hours(1),
                   [&](const absl::Status& s, const std::vector<std::string>&) { after = s; });
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable);
}

TEST_F(CoreTest, RecoveryKeepsJobsAndFailsTheRunningOnesWithoutRestarts) {
  RecordingChannel a;
  AddWorker("h", "cpu", &a);
  const std::string running = Submit(1);
  const std::string pending = Submit(1);
  core_.reset();  // the coordinator dies
  CoordinatorCore restarted(store_.get(), CoordinatorOptions{});
  ASSERT_TRUE(restarted.Recover().ok());
  EXPECT_EQ(restarted.GetJob(running)->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(restarted.GetJob(running)->message().find("restarted"), std::string::npos);
  EXPECT_EQ(restarted.GetJob(pending)->state(), v1::JOB_STATE_PENDING);
  // New ids do not collide with recovered ones.
  v1::SubmitJobRequest r;
  r.set_spec_toml(kSpec);
  r.set_workers(1);
  EXPECT_EQ(*restarted.Submit(r), "job-3");
}

// Rank health: lag behind the fastest rank, rendezvous, and a stall that
// names the rank behind on collectives and clears when progress resumes.
TEST_F(CoreTest, LagAndStallNameTheRankBehindAndClearOnProgress) {
  CoordinatorOptions o;
  o.heartbeat_interval = absl::Seconds(10);  // heartbeats stay fresh for the whole test
  o.stall_after = absl::Seconds(5);
  int rendezvous = 0;
  o.events.rendezvous_done = [&](absl::Duration) { ++rendezvous; };
  core_ = std::make_unique<CoordinatorCore>(store_.get(), o);
  RecordingChannel a, b;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  ASSERT_EQ(State(job), "RUNNING");
  v1::RankConnected c;
  c.set_job_id(job);
  c.set_rank(0);
  core_->OnConnected(wa, c);
  EXPECT_EQ(rendezvous, 0) << "rendezvous is done only when every rank connected";
  c.set_rank(1);
  core_->OnConnected(wb, c);
  EXPECT_EQ(rendezvous, 1);

  auto beat = [&](const std::string& w, int64_t step, int64_t seq) {
    v1::Heartbeat hb;
    hb.set_step(step);
    hb.set_last_collective_seq(seq);
    core_->OnHeartbeat(w, hb);
  };
  beat(wa, 3, 40);
  beat(wb, 2, 37);
  v1::Job j = *core_->GetJob(job);
  ASSERT_EQ(j.ranks_size(), 2);
  EXPECT_EQ(j.ranks(0).lag_steps(), 0);
  EXPECT_EQ(j.ranks(1).lag_steps(), 1);
  EXPECT_EQ(j.ranks(1).lag_collectives(), 3);
  EXPECT_EQ(j.ranks(1).host(), "h2");
  EXPECT_EQ(j.stalled(), "");

  core_->Tick(absl::Now() + absl::Seconds(2));
  EXPECT_EQ(core_->GetJob(job)->stalled(), "") << "not yet past stall_after";
  core_->Tick(absl::Now() + absl::Seconds(6));
  j = *core_->GetJob(job);
  EXPECT_NE(j.stalled().find("rank 1 behind at collective #37 (others at #40)"), std::string::npos) << j.stalled();
  EXPECT_FALSE(j.ranks(0).stalled());
  EXPECT_TRUE(j.ranks(1).stalled());
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING) << "a stall is a signal, not a verdict";

  beat(wb, 3, 41);  // rank 1 moves again
  core_->Tick(absl::Now());
  j = *core_->GetJob(job);
  EXPECT_EQ(j.stalled(), "");
  EXPECT_FALSE(j.ranks(1).stalled());
  EXPECT_EQ(j.ranks(0).lag_collectives(), 1);

  Finish(wa, job, 0, true);
  Finish(wb, job, 1, true);
  j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(j.ranks_size(), 0) << "ranks are reported while the job runs only";
}

// Every rank waiting after the same collective: no single culprit, all named.
TEST_F(CoreTest, StallWithEveryRankAtTheSameCollectiveNamesThemAll) {
  CoordinatorOptions o;
  o.heartbeat_interval = absl::Seconds(10);
  o.stall_after = absl::Seconds(5);
  core_ = std::make_unique<CoordinatorCore>(store_.get(), o);
  RecordingChannel a, b;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  for (const auto& w : {wa, wb}) {
    v1::Heartbeat hb;
    hb.set_step(4);
    hb.set_last_collective_seq(50);
    core_->OnHeartbeat(w, hb);
  }
  core_->Tick(absl::Now() + absl::Seconds(6));
  v1::Job j = *core_->GetJob(job);
  EXPECT_NE(j.stalled().find("every rank waits after collective #50"), std::string::npos) << j.stalled();
  EXPECT_TRUE(j.ranks(0).stalled() && j.ranks(1).stalled());
}

// A save is a vote summed over the world at a step, so one rank's request
// saves everyone at one step; a request to each rank saved twice whenever the
// messages reached the ranks on either side of a step (a flake of
// e2e_checkpoints: ckpt save left steps 12 and 13).
TEST_F(CoreTest, CheckpointNowTellsOneRankOfTheJob) {
  RecordingChannel a, b;
  AddWorker("host-a", "cpu", &a);
  AddWorker("host-b", "cpu", &b);
  const std::string job = Submit(2);
  ASSERT_EQ(State(job), "RUNNING");
  ASSERT_TRUE(core_->CheckpointNow(job).ok());
  int told = 0;
  for (const RecordingChannel* ch : {&a, &b}) {
    for (const auto& m : ch->sent) told += m.has_checkpoint() && m.checkpoint().job_id() == job;
  }
  EXPECT_EQ(told, 1);
  EXPECT_EQ(core_->CheckpointNow("job-999").code(), absl::StatusCode::kNotFound);
}

TEST_F(CoreTest, CheckpointReportsNameOnlyTheRanksOwnFileOfARunningJob) {
  RecordingChannel a, b;
  AddWorker("h1", "cpu", &a);
  AddWorker("h2", "cpu", &b);
  v1::SubmitJobRequest req;
  req.set_spec_toml(kSpec);
  req.set_workers(2);
  req.set_base_dir(dir_);
  const std::string job = *core_->Submit(req);
  const std::string root = core_->GetJob(job)->checkpoint_root();
  // Each rank's credential came with its assignment.
  const std::string cred[] = {a.Starts().at(0).credential(), b.Starts().at(0).credential()};
  ASSERT_EQ(cred[0].size(), 64u);
  ASSERT_NE(cred[0], cred[1]);
  auto report = [&](int rank, int64_t step, const std::string& path, const std::string& credential = "") {
    v1::CheckpointReport r;
    r.set_job_id(job);
    r.set_rank(rank);
    r.set_step(step);
    r.set_path(path);
    r.set_size_bytes(10);
    r.set_checksum(std::string(64, 'a'));
    return core_->ReportCheckpoint(r, credential.empty() && rank < 2 ? cred[rank] : credential);
  };
  // Without the rank's own credential (another rank's, a made-up one, or
  // none for a rank that does not exist) nothing is looked at.
  EXPECT_EQ(report(1, 2, RankFilePath(root, 2, 1), cred[0]).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(report(0, 2, RankFilePath(root, 2, 0), std::string(64, '0')).code(), absl::StatusCode::kPermissionDenied);
  // A forged file elsewhere (the coordinator would write a manifest beside
  // it, then prune that directory) is refused, as is a neighbour's file.
  absl::Status s = report(0, 2, dir_ + "/elsewhere/rank-00000.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("is not the rank's checkpoint file " + root + "/step-00000002/rank-00000.safetensors"),
            std::string::npos)
      << s;
  EXPECT_EQ(report(0, 2, root + "/step-00000002/rank-00001.safetensors").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(report(0, 2, root + "/step-00000002/../../x/rank-00000.safetensors").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(report(2, 2, RankFilePath(root, 2, 2)).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(report(0, 99, RankFilePath(root, 99, 0)).code(), absl::StatusCode::kInvalidArgument);
  // The ranks' own files commit the step, with the manifest in the computed directory.
  std::filesystem::create_directories(root + "/step-00000002");
  ASSERT_TRUE(report(0, 2, RankFilePath(root, 2, 0)).ok());
  ASSERT_TRUE(report(1, 2, RankFilePath(root, 2, 1)).ok());
  EXPECT_TRUE(std::filesystem::exists(root + "/step-00000002/manifest.json"));
  EXPECT_EQ(core_->GetJob(job)->checkpoints_size(), 1);
  // A job that ended takes no more checkpoints.
  ASSERT_TRUE(core_->Cancel(job).ok());
  s = report(0, 3, RankFilePath(root, 3, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // A recorded checkpoint whose manifest is gone (a crash while pruning, by
  // an older coordinator) is not listed after a restart.
  core_.reset();
  std::filesystem::remove(root + "/step-00000002/manifest.json");
  CoordinatorCore restarted(store_.get(), CoordinatorOptions{});
  ASSERT_TRUE(restarted.Recover().ok());
  EXPECT_TRUE(restarted.ListCheckpoints(job)->empty());
}

TEST_F(CoreTest, OnlyTheSessionHoldingARankSpeaksForIt) {
  // A rogue session (registered, idle, or holding another job's rank) that
  // names both ranks of someone else's job finished, progressed or
  // connected changes nothing, and each attempt is counted.
  std::vector<std::string> refused;
  CoordinatorOptions options{absl::Milliseconds(100), 3, absl::Milliseconds(50), absl::Milliseconds(50)};
  options.events.refused = [&](const char* what) { refused.push_back(what); };
  core_ = std::make_unique<CoordinatorCore>(store_.get(), options);
  RecordingChannel a, b, rogue_channel;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  ASSERT_EQ(State(job), "RUNNING");
  const std::string rogue = AddWorker("h3", "cpu", &rogue_channel);
  Finish(rogue, job, 0, true);
  Finish(rogue, job, 1, true);
  Finish(wa, job, 1, true);  // rank 1 is wb's
  v1::Progress p;
  p.set_job_id(job);
  p.set_rank(0);
  p.set_step(4);
  p.set_loss(0.5);
  core_->OnProgress(rogue, p);
  EXPECT_EQ(State(job), "RUNNING");
  EXPECT_EQ(core_->GetJob(job)->step(), 0);
  EXPECT_EQ(refused, (std::vector<std::string>{"finished", "finished", "finished", "progress"}));
  // The holders themselves are heard, and the job can still be cancelled.
  core_->OnProgress(wa, p);
  EXPECT_EQ(core_->GetJob(job)->step(), 4);
  Finish(wa, job, 0, true);
  Finish(wb, job, 1, true);
  EXPECT_EQ(State(job), "SUCCEEDED");
  EXPECT_EQ(refused.size(), 4u);
}

TEST_F(CoreTest, TheStoreServesOnlyTheRanksOfARunningJobTheirOwnKeys) {
  RecordingChannel a, b;
  AddWorker("h1", "cpu", &a);
  AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2), other = Submit(2);  // the second waits
  const std::string cred = a.Starts().at(0).credential();
  EXPECT_TRUE(core_->AuthorizeStore(cred, {job + "/rank_0", job + "/rank_1"}).ok());
  // Another job's keys, a key outside every namespace, no or a made-up credential.
  EXPECT_EQ(core_->AuthorizeStore(cred, {job + "/rank_0", other + "/rank_0"}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(core_->AuthorizeStore(cred, {"rank_0"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(core_->AuthorizeStore("", {job + "/rank_0"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(core_->AuthorizeStore(std::string(64, 'f'), {job + "/rank_0"}).code(),
            absl::StatusCode::kPermissionDenied);
  // When the job ends its ranks lose the store (and its keys are dropped).
  ASSERT_TRUE(core_->StoreSet(job + "/rank_0", "addr").ok());
  ASSERT_TRUE(core_->Cancel(job).ok());
  EXPECT_EQ(core_->AuthorizeStore(cred, {job + "/rank_0"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(core_->StoreGet(job + "/rank_0").status().code(), absl::StatusCode::kNotFound);
}

// The one transition table: every legal move, repeats as no-ops, and the
// illegal ones refused naming both states.
TEST(JobStateTest, TheTransitionTableAllowsExactlyTheLifecycle) {
  const std::vector<v1::JobState> all = {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING,   v1::JOB_STATE_SUCCEEDED,
                                         v1::JOB_STATE_FAILED,  v1::JOB_STATE_CANCELLED, v1::JOB_STATE_RESTARTING};
  const std::set<std::pair<v1::JobState, v1::JobState>> legal = {
      {v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING},     {v1::JOB_STATE_PENDING, v1::JOB_STATE_CANCELLED},
      {v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED},   {v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED},
      {v1::JOB_STATE_RUNNING, v1::JOB_STATE_CANCELLED},   {v1::JOB_STATE_RUNNING, v1::JOB_STATE_RESTARTING},
      {v1::JOB_STATE_RESTARTING, v1::JOB_STATE_RUNNING},  {v1::JOB_STATE_RESTARTING, v1::JOB_STATE_FAILED},
      {v1::JOB_STATE_RESTARTING, v1::JOB_STATE_CANCELLED}};
  for (v1::JobState from : all) {
    for (v1::JobState to : all) {
      absl::StatusOr<bool> t = CheckJobTransition(from, to);
      if (from == to) {
        EXPECT_TRUE(t.ok() && !*t) << JobStateName(from) << " repeated";
      } else if (legal.count({from, to})) {
        EXPECT_TRUE(t.ok() && *t) << JobStateName(from) << " -> " << JobStateName(to);
      } else {
        ASSERT_FALSE(t.ok()) << JobStateName(from) << " -> " << JobStateName(to);
        EXPECT_EQ(t.status().message(),
                  absl::StrCat("a job cannot go from ", JobStateName(from), " to ", JobStateName(to)));
      }
    }
    EXPECT_EQ(IsFinalJobState(from), from != v1::JOB_STATE_PENDING && from != v1::JOB_STATE_RUNNING &&
                                         from != v1::JOB_STATE_RESTARTING);
    EXPECT_EQ(*ParseJobState(JobStateName(from)), from);  // names round-trip (legacy records)
  }
  EXPECT_FALSE(ParseJobState("UNSPECIFIED").ok());
  EXPECT_FALSE(ParseJobState("").ok());
}

// A record without a state (written before JobState, or damaged) is named
// and kept as FAILED for the operator, never guessed; the rest serve.
TEST_F(CoreTest, ARecordWithoutAStateIsKeptAsFailedAndNamed) {
  StoredJob good, stateless;
  good.job.set_id("job-7");
  good.job.set_state(v1::JOB_STATE_SUCCEEDED);
  good.spec_toml = kSpec;
  ASSERT_TRUE(store_->PutJob(good).ok());
  stateless = good;
  stateless.job.set_id("job-8");
  stateless.job.clear_state();
  ASSERT_TRUE(store_->PutJob(stateless).ok());
  core_.reset();
  CoordinatorCore restarted(store_.get(), CoordinatorOptions{});
  std::vector<std::string> problems;
  ASSERT_TRUE(restarted.Recover(&problems).ok());
  EXPECT_EQ(restarted.GetJob("job-7")->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(restarted.GetJob("job-8")->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(restarted.GetJob("job-8")->message().find("is not a job state"), std::string::npos)
      << restarted.GetJob("job-8")->message();
  ASSERT_EQ(problems.size(), 1u);
}

}  // namespace
}  // namespace shardline
