// CoordinatorCore's restarts (issue 13, docs/design.md "Control plane"): a lost
// rank or a retryable error sends a job RESTARTING; it starts again from its
// newest checkpoint at the largest world it can have, grows back at a
// checkpoint, fails naming every attempt once restarts or time are spent,
// survives the coordinator's own restart; strategy = "auto" picks again at
// every attempt.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/job/job_wire.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"
#include "tests/unit/core_fixture.h"

namespace shardline {
namespace {

using namespace testing_core;  // NOLINT: the fixture's names

// Restarts (issue 13): a job of 3 workers that may run on 2.
const std::string kRestartSpec =
    TinySpec("workers = 3\nmin_workers = 2\nmax_restarts = 2\nrestart_timeout = 60", 50);

class RestartTest : public CoreTest {
 protected:
  // With `fake_clock`, the core's time is now_, which only the test moves.
  void Open(absl::Duration settle, bool fake_clock = false,
            absl::Duration rendezvous_grace = absl::Milliseconds(50)) {
    CoordinatorOptions o{absl::Milliseconds(100), 3, absl::Milliseconds(50), rendezvous_grace};
    o.restart_settle = settle;
    if (fake_clock) o.clock = [this] { return now_; };
    o.events.job_restarting = [this](const std::string&) { ++restarting_events_; };
    o.events.job_restarted = [this](double lost) { lost_.push_back(lost); };
    core_ = std::make_unique<CoordinatorCore>(store_.get(), o);
  }
  std::string SubmitRestartable(const std::string& spec = kRestartSpec) {
    v1::SubmitJobRequest r;
    r.set_spec_toml(spec);
    r.set_base_dir(dir_);
    auto id = core_->Submit(r);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }
  // Every rank of the running attempt reports its file of `step`.
  void Commit(const std::string& job, int64_t step, const std::vector<RecordingChannel*>& ranks) {
    for (RecordingChannel* ch : ranks) {
      const v1::Assignment a = ch->Starts().back();
      ASSERT_TRUE(core_->ReportCheckpoint(ReportOf(job, a, step), a.credential()).ok());
    }
  }
  void Progress(const std::string& worker, const std::string& job, int64_t step) {
    v1::Progress p;
    p.set_job_id(job);
    p.set_rank(0);
    p.set_step(step);
    core_->OnProgress(worker, p);
  }
  int restarting_events_ = 0;
  std::vector<double> lost_;
  absl::Time now_ = absl::FromUnixSeconds(1800000000);
};

// Ranks that time out in a ring report the link they waited on; the one of
// the lowest (seq, step) is the broken one (the others waited on ranks that
// were waiting). The failure names both ends, and the receiving end sits the
// next attempt out, so the job runs on the other two.
TEST_F(RestartTest, ABrokenLinkIsNamedByBothEndsAndOneEndSitsOut) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  ASSERT_EQ(State(job), "RUNNING");
  auto fail = [&](const std::string& worker, int rank, int from, int64_t seq, int step) {
    v1::RankFinished f;
    f.set_job_id(job);
    f.set_rank(rank);
    f.set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    f.set_message(absl::StrCat("[rank ", rank, "] all_gather #", seq, " step ", step, ": no data from rank ", from));
    f.mutable_link()->set_from_rank(from);
    f.mutable_link()->set_to_rank(rank);
    f.mutable_link()->set_seq(seq);
    f.mutable_link()->set_step(step);
    core_->OnFinished(worker, f);
  };
  // 0 -> 1 is cut: rank 1 is stuck at step 1; 2 and 0 wait further on.
  fail(wc, 2, 1, 40, 2);
  fail(wb, 1, 0, 40, 1);
  fail(wa, 0, 2, 40, 2);
  core_->Tick(absl::Now() + absl::Milliseconds(150));  // past the failure grace (50 ms), within the lease
  v1::Job j = *core_->GetJob(job);
  ASSERT_GE(j.attempts_size(), 1);
  EXPECT_NE(j.attempts(0).end().find("rank 0 on host h1 cannot reach rank 1 on host h2"), std::string::npos)
      << j.attempts(0).end();
  // The others stopped; the restart leaves h2 out and runs on h1 and h3.
  core_->Tick(absl::Now() + absl::Milliseconds(150));
  j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.workers(), 2);
  EXPECT_EQ(b.Starts().size(), 1u);
  EXPECT_EQ(a.Starts().size(), 2u);
  EXPECT_EQ(c.Starts().size(), 2u);
}

// A rendezvous cut between ranks 0 and 1: the rank that did connect times
// out in its first collective at once, while 0 and 1 probe each other
// (worker/comm/link_probe.h) before they report. Held for the rendezvous
// grace, not the shorter one, the probe's link (sequence -1) is the one
// named, and its end sits out.
TEST_F(RestartTest, AFailedRendezvousWaitsForTheProbeThatNamesTheLink) {
  // A fake clock: the grace (200 ms) ends inside the workers' lease (300 ms).
  Open(absl::ZeroDuration(), /*fake_clock=*/true, /*rendezvous_grace=*/absl::Milliseconds(200));
  RecordingChannel a, b, c;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  ASSERT_EQ(State(job), "RUNNING");
  auto fail = [&](const std::string& worker, int rank, absl::StatusCode code, int from, int to, int64_t seq,
                  const std::string& message) {
    v1::RankFinished f;
    f.set_job_id(job);
    f.set_rank(rank);
    f.set_code(static_cast<int>(code));
    f.set_message(message);
    f.mutable_link()->set_from_rank(from);
    f.mutable_link()->set_to_rank(to);
    f.mutable_link()->set_seq(seq);
    core_->OnFinished(worker, f);
  };
  fail(wc, 2, absl::StatusCode::kDeadlineExceeded, 1, 2, 0, "[rank 2] broadcast #0 ring step 0: no data from rank 1");
  now_ += absl::Milliseconds(100);  // past failure_grace, within the rendezvous grace
  core_->Tick(now_);
  ASSERT_EQ(State(job), "RUNNING");
  fail(wa, 0, absl::StatusCode::kUnavailable, 0, 1, -1,
       "[rank 0] group shard.0/: Gloo rendezvous failed: Connect timeout; rank 1 at 10.0.0.2:41000 cannot be "
       "reached from here (timed out)");
  fail(wb, 1, absl::StatusCode::kUnavailable, 1, 0, -1,
       "[rank 1] group shard.0/: Gloo rendezvous failed: Connect timeout; rank 0 at 10.0.0.1:41000 cannot be "
       "reached from here (timed out)");
  now_ += absl::Milliseconds(150);
  core_->Tick(now_);
  v1::Job j = *core_->GetJob(job);
  ASSERT_GE(j.attempts_size(), 1);
  EXPECT_NE(j.attempts(0).end().find("rank 0 on host h1 cannot reach rank 1 on host h2"), std::string::npos)
      << j.attempts(0).end();
  core_->Tick(now_);
  j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.workers(), 2);
  EXPECT_EQ(b.Starts().size(), 1u);  // h2, the far end, sits out
}

// Two workers that give one --host name are told apart by their addresses:
// a link cut between them benches the receiving end alone (not every worker
// of that name), the failure names both addresses, and the job goes on.
TEST_F(RestartTest, TwoWorkersOfOneHostNameAreToldApartByAddress) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c;
  const std::string wa = AddWorker("dup", "cpu", &a, 0, "10.0.0.1");
  const std::string wb = AddWorker("dup", "cpu", &b, 0, "10.0.0.2");
  const std::string wc = AddWorker("other", "cpu", &c, 0, "10.0.0.3");
  const std::string job = SubmitRestartable();
  ASSERT_EQ(State(job), "RUNNING");
  // Ranks by host, then registration: dup's two are ranks 0 and 1. 0 -> 1
  // is cut: rank 1 is stuck at ring step 1; 2 and 0 wait further on.
  auto fail = [&](const std::string& worker, int rank, int from, int step) {
    v1::RankFinished f;
    f.set_job_id(job);
    f.set_rank(rank);
    f.set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    f.set_message(absl::StrCat("[rank ", rank, "] all_gather #40 ring step ", step, ": no data from rank ", from));
    f.mutable_link()->set_from_rank(from);
    f.mutable_link()->set_to_rank(rank);
    f.mutable_link()->set_seq(40);
    f.mutable_link()->set_step(step);
    core_->OnFinished(worker, f);
  };
  fail(wc, 2, 1, 2);
  fail(wb, 1, 0, 1);
  fail(wa, 0, 2, 2);
  core_->Tick(absl::Now() + absl::Milliseconds(150));
  v1::Job j = *core_->GetJob(job);
  ASSERT_GE(j.attempts_size(), 1);
  EXPECT_NE(j.attempts(0).end().find("rank 0 on host dup (10.0.0.1) cannot reach rank 1 on host dup (10.0.0.2)"),
            std::string::npos)
      << j.attempts(0).end();
  EXPECT_NE(j.attempts(0).end().find("dup/cpu@10.0.0.2 sits out"), std::string::npos) << j.attempts(0).end();
  core_->Tick(absl::Now() + absl::Milliseconds(150));
  j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.workers(), 2);  // a (dup, 10.0.0.1) and c: only b sits out
  EXPECT_EQ(a.Starts().size(), 2u);
  EXPECT_EQ(b.Starts().size(), 1u);
  EXPECT_EQ(c.Starts().size(), 2u);
}

// A session that says it still runs a job: with a worker token anyone can
// say so. Only the rank's credential makes the job wait for it.
TEST_F(RestartTest, OnlyAProvenClaimMakesTheJobWaitForTheClaimant) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c, rogue, back;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  ASSERT_EQ(State(job), "RUNNING");
  auto claim = [&](const std::string& host, int rank, const std::string& credential, RecordingChannel* ch) {
    v1::WorkerInfo info;
    info.set_host(host);
    info.set_device("cpu");
    info.set_job_id(job);
    info.set_rank(rank);
    info.set_claim_credential(credential);
    return core_->RegisterWorker(info, ch)->worker_id();
  };
  auto worker = [&](const std::string& id) {
    for (const v1::WorkerInfo& w : core_->ListWorkers()) {
      if (w.worker_id() == id) return w;
    }
    return v1::WorkerInfo();
  };
  // A claim without the credential: told to stop, busy, tied to no job.
  const std::string wr = claim("rogue", 1, "not-the-credential", &rogue);
  EXPECT_EQ(rogue.Cancels(), 1);
  EXPECT_EQ(worker(wr).state(), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(worker(wr).job_id(), "");
  EXPECT_EQ(worker(wr).claim_credential(), "");  // never kept, never listed
  // The job loses a rank and restarts once its own ranks stopped, not
  // waiting for the rogue.
  core_->WorkerGone(wc, "session closed");
  Finish(wa, job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  Finish(wb, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  core_->Tick(absl::Now());
  v1::Job j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.message().find("rogue"), std::string::npos) << j.message();
  // The rogue says it finished "its" job: it is idle again, and the job is untouched.
  Finish(wr, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  EXPECT_EQ(worker(wr).state(), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(State(job), "RUNNING");
  // Rank 2 of the first attempt comes back with its credential: proven, so
  // the job knows it is still stopping.
  const std::string wback = claim("h3", 2, c.Starts().back().credential(), &back);
  EXPECT_EQ(back.Cancels(), 1);
  EXPECT_EQ(worker(wback).job_id(), job);
  Finish(wback, job, 2, false, "cancelled", absl::StatusCode::kCancelled);
  EXPECT_EQ(worker(wback).state(), v1::WORKER_STATE_IDLE);
}

TEST_F(RestartTest, ALostRankRestartsFromTheNewestCheckpointAtTheLargestWorldThenGrowsBack) {
  Open(absl::ZeroDuration(), /*fake_clock=*/true);
  RecordingChannel a, b, c, d;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  ASSERT_EQ(State(job), "RUNNING");
  Commit(job, 2, {&a, &b, &c});
  Progress(wa, job, 3);
  now_ += absl::Seconds(30);  // the attempt ran steps 0-3 in 30 s, its workers heartbeating
  for (const std::string& w : {wa, wb, wc}) core_->OnHeartbeat(w, v1::Heartbeat());
  core_->WorkerGone(wc, "session closed");
  v1::Job j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(j.message().find("restarting (1 of at most 2) after: worker lost: rank 2 on host h3"), std::string::npos)
      << j.message();
  EXPECT_EQ(restarting_events_, 1);
  EXPECT_EQ(a.Cancels(), 1);
  EXPECT_EQ(b.Cancels(), 1);
  ASSERT_EQ(j.attempts_size(), 1);
  EXPECT_EQ(j.attempts(0).world_size(), 3);
  EXPECT_EQ(j.attempts(0).last_step(), 3);
  EXPECT_NE(j.attempts(0).end().find("worker lost"), std::string::npos);
  // Not before its survivors stopped: they still run the old attempt.
  core_->Tick(now_);
  EXPECT_EQ(State(job), "RESTARTING");
  EXPECT_NE(core_->GetJob(job)->message().find("rank 2 on host h3 (w-3, session closed); waiting for rank 0 on h1 to "
                                               "stop its last attempt"),
            std::string::npos)
      << core_->GetJob(job)->message();
  Finish(wa, job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  EXPECT_EQ(State(job), "RESTARTING");
  Finish(wb, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  // On the two that are left, from step 2.
  j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.workers(), 2);
  EXPECT_EQ(j.requested_workers(), 3);
  EXPECT_EQ(j.step(), 2);
  EXPECT_EQ(j.restarts(), 1);
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(j.attempts(1).world_size(), 2);
  EXPECT_EQ(j.attempts(1).first_step(), 2);
  // Step 3 was not saved (the newest checkpoint is step 2): a third of the
  // attempt's 30 s is lost; it restarted at once (down 0 s).
  EXPECT_DOUBLE_EQ(j.attempts(0).lost_seconds(), 10.0);
  ASSERT_EQ(lost_.size(), 1u);
  EXPECT_DOUBLE_EQ(lost_[0], 10.0);
  ASSERT_EQ(a.Starts().size(), 2u);
  ASSERT_EQ(b.Starts().size(), 2u);
  for (const RecordingChannel* ch : {&a, &b}) {
    EXPECT_EQ(ch->Starts().back().world_size(), 2);
    EXPECT_EQ(ch->Starts().back().resume_from(), j.checkpoint_root() + "/step-00000002");
    EXPECT_NE(ch->Starts().back().credential(), ch->Starts().front().credential());
  }
  // The old attempt's credentials open nothing any more.
  EXPECT_EQ(core_->AuthorizeStore(a.Starts().front().credential(), {job + "/k"}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(core_->AuthorizeStore(a.Starts().back().credential(), {job + "/k"}).ok());
  // Attempts are fenced by file name: the second attempt's ranks write
  // rank-N.a0002, and a report of the first attempt's name is refused, even
  // with the current credential (a stale writer's file never enters a manifest).
  EXPECT_EQ(a.Starts().front().attempt(), 1);
  EXPECT_EQ(a.Starts().back().attempt(), 2);
  {
    v1::CheckpointReport stale;
    stale.set_job_id(job);
    stale.set_rank(0);
    stale.set_step(4);
    stale.set_path(RankFilePath(j.checkpoint_root(), 4, 0, /*attempt=*/1));
    stale.set_size_bytes(10);
    stale.set_checksum(std::string(64, 'a'));
    EXPECT_EQ(core_->ReportCheckpoint(stale, a.Starts().back().credential()).code(),
              absl::StatusCode::kPermissionDenied);
  }
  // A replacement registers: at the next commit the job stops and grows back to 3.
  const std::string wd = AddWorker("h4", "cpu", &d);
  EXPECT_EQ(State(job), "RUNNING");
  Commit(job, 4, {&a, &b});
  {
    absl::StatusOr<CheckpointManifest> m = ReadManifest(j.checkpoint_root() + "/step-00000004");
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->ranks.size(), 2u);
    EXPECT_EQ(m->ranks[0].file, "rank-00000.a0002.safetensors");
  }
  j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(j.message().find("growing from 2 to 3 workers from the checkpoint of step 4"), std::string::npos)
      << j.message();
  Finish(wa, job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  Finish(wb, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.workers(), 3);
  EXPECT_EQ(j.restarts(), 1);  // growing is no restart
  ASSERT_EQ(d.Starts().size(), 1u);
  EXPECT_EQ(d.Starts()[0].resume_from(), j.checkpoint_root() + "/step-00000004");
  // A rank's own error that would recur fails the job at once, naming every attempt.
  Finish(wd, job, d.Starts()[0].rank(), false, "rank-00002.safetensors: checksum mismatch", absl::StatusCode::kDataLoss);
  j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.message().rfind("rank 2 on host h4 failed: rank-00002.safetensors: checksum mismatch; attempts: [1] 3 "
                              "workers, steps 0-3: worker lost",
                              0),
            0u)
      << j.message();
  EXPECT_NE(j.message().find("[2] 2 workers, steps 2-4: stopped at the checkpoint of step 4 to grow"),
            std::string::npos)
      << j.message();
  EXPECT_NE(j.message().find("[3] 3 workers, steps 4-4: rank 2 on host h4 failed"), std::string::npos) << j.message();
  EXPECT_EQ(restarting_events_, 1);
}

TEST_F(RestartTest, WithinTheSettlingTimeARestartWaitsForAllItsWorkers) {
  Open(absl::Hours(1));
  RecordingChannel a, b, c, d;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  core_->WorkerGone(wc, "session closed");
  Finish(wa, job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  Finish(wb, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  EXPECT_EQ(State(job), "RESTARTING");  // two are idle, but it may still have three
  EXPECT_NE(core_->GetJob(job)->message().find("; waiting for 3 idle workers of one device kind (idle: 2 cpu)"),
            std::string::npos)
      << core_->GetJob(job)->message();
  AddWorker("h4", "cpu", &d);
  v1::Job j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(j.workers(), 3);
  EXPECT_TRUE(j.attempts(1).first_step() == 0);  // no checkpoint: from the start
  EXPECT_EQ(d.Starts().at(0).resume_from(), "");
}

TEST_F(RestartTest, SpentRestartsAndTheRestartTimeoutFailTheJobNamingEveryAttempt) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c, d;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  std::string spec = kRestartSpec;
  spec.replace(spec.find("max_restarts = 2"), 16, "max_restarts = 1");
  const std::string job = SubmitRestartable(spec);
  core_->WorkerGone(wc, "session closed");
  Finish(wa, job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  Finish(wb, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  ASSERT_EQ(State(job), "RUNNING");
  // A peer's connection error after the grace is retryable, but none is left.
  Finish(wb, job, 1, false, "all_gather #9: connection reset by rank 0", absl::StatusCode::kUnavailable);
  core_->Tick(absl::Now() + absl::Milliseconds(60));
  v1::Job j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.message().rfind("rank 1 on host h2 failed: all_gather #9", 0), 0u) << j.message();
  EXPECT_NE(j.message().find("[1] 3 workers, steps 0-0: worker lost: rank 2 on host h3"), std::string::npos)
      << j.message();
  EXPECT_NE(j.message().find("[2] 2 workers, steps 0-0: rank 1 on host h2 failed"), std::string::npos) << j.message();

  // A restart that finds too few workers within restart_timeout fails.
  Finish(wa, job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  const std::string job2 = SubmitRestartable();
  ASSERT_EQ(State(job2), "PENDING");  // two workers are left for three
  AddWorker("h4", "cpu", &d);
  ASSERT_EQ(State(job2), "RUNNING");
  core_->WorkerGone(wa, "session closed");
  core_->WorkerGone(wb, "session closed");
  EXPECT_EQ(State(job2), "RESTARTING");
  core_->Tick(absl::Now() + absl::Seconds(61));
  j = *core_->GetJob(job2);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.message().rfind("not restarted within [job] restart_timeout (1m)", 0), 0u) << j.message();
}

TEST_F(RestartTest, ACoordinatorThatRestartedRestartsItsRunningJobsOnceWorkersReconnect) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c;
  AddWorker("h1", "cpu", &a);
  AddWorker("h2", "cpu", &b);
  AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  Commit(job, 2, {&a, &b, &c});
  core_.reset();  // the coordinator dies; its workers keep running job's ranks
  Open(absl::ZeroDuration());
  ASSERT_TRUE(core_->Recover().ok());
  v1::Job j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RESTARTING);
  EXPECT_NE(j.message().find("the coordinator restarted while the job was running"), std::string::npos);
  // They reconnect still running it: each is told to stop, and holds no rank
  // of the next attempt (what it says of its old rank is not the job's).
  RecordingChannel a2, b2, c2;
  std::vector<std::string> ids;
  for (RecordingChannel* ch : {&a2, &b2, &c2}) {
    v1::WorkerInfo info;
    info.set_host(ch == &a2 ? "h1" : ch == &b2 ? "h2" : "h3");
    info.set_device("cpu");
    info.set_job_id(job);
    ids.push_back(core_->RegisterWorker(info, ch)->worker_id());
    EXPECT_EQ(ch->Cancels(), 1);
  }
  EXPECT_EQ(State(job), "RESTARTING");
  for (int i = 0; i < 3; ++i) Finish(ids[i], job, i, false, "cancelled", absl::StatusCode::kCancelled);
  j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.workers(), 3);
  EXPECT_EQ(a2.Starts().at(0).resume_from(), j.checkpoint_root() + "/step-00000002");
  // A late word from an earlier attempt's rank 0 changes nothing.
  RecordingChannel stray;
  v1::WorkerInfo info;
  info.set_host("h9");
  info.set_device("cpu");
  info.set_job_id(job);
  const std::string ws = core_->RegisterWorker(info, &stray)->worker_id();
  Finish(ws, job, 0, true);
  Finish(ids[0], job, 0, true);
  Finish(ids[1], job, 1, true);
  EXPECT_EQ(State(job), "RUNNING");  // rank 2 has not finished; the stray's word is no rank's
  Finish(ids[2], job, 2, true);
  EXPECT_EQ(State(job), "SUCCEEDED");
}


// strategy = "auto": each attempt's assignment names the planner's pick, the
// job says why, and a restart picks again with the bandwidth its ranks
// measured.
TEST_F(RestartTest, AutoPicksAStrategyForEachAttempt) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b;
  const std::vector<std::string> ids = {AddWorker("h1", "cpu", &a, int64_t{16} << 30),
                                        AddWorker("h2", "cpu", &b, int64_t{16} << 30)};
  std::string spec = kRestartSpec;
  spec.replace(spec.find("workers = 3\nmin_workers = 2"), 27, "workers = 2\nmin_workers = 1");
  spec += "[parallelism]\nstrategy = \"auto\"\n";
  const std::string job = SubmitRestartable(spec);
  v1::Job j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.strategy_reason().rfind("auto: ", 0), 0u) << j.strategy_reason();
  EXPECT_NE(j.strategy_reason().find("assumed until measured"), std::string::npos) << j.strategy_reason();
  EXPECT_NE(j.message().find(j.strategy_reason()), std::string::npos) << j.message();
  ASSERT_EQ(a.Starts().size(), 1u);
  // The resolved spec carries the pick, and auto still set so that the
  // ranks measure the link for the next one.
  absl::StatusOr<JobConfig> sent = DecodeJobConfig(a.Starts()[0].spec(), job);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(StrategyName(sent->parallelism.strategy), j.strategy());
  EXPECT_TRUE(sent->parallelism.auto_strategy);
  // The ranks measured the bus, their compute and the CPU a byte sent costs
  // after they connected: the slower rank's figures count.
  for (int rank : {0, 1}) {
    v1::RankConnected c;
    c.set_job_id(job);
    c.set_rank(rank);
    c.set_bus_bandwidth(rank == 0 ? 3e9 : 1.5e9);
    c.set_compute_flops(rank == 0 ? 40e9 : 20e9);
    c.set_comm_cpu_s_per_byte(rank == 0 ? 1e-9 : 3e-9);
    core_->OnConnected(ids[rank], c);
  }
  // A figure no rank can have measured changes nothing.
  v1::RankConnected bogus;
  bogus.set_job_id(job);
  bogus.set_rank(1);
  bogus.set_bus_bandwidth(std::nan(""));
  bogus.set_compute_flops(1e30);
  bogus.set_comm_cpu_s_per_byte(-1);
  core_->OnConnected(ids[1], bogus);
  EXPECT_DOUBLE_EQ(core_->GetJob(job)->measured_bus_bandwidth(), 1.5e9);
  EXPECT_DOUBLE_EQ(core_->GetJob(job)->measured_compute_flops(), 20e9);
  EXPECT_DOUBLE_EQ(core_->GetJob(job)->measured_comm_cpu_s_per_byte(), 3e-9);
  core_->WorkerGone(ids[1], "session closed");
  Finish(ids[0], job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.workers(), 1);
  EXPECT_NE(j.strategy_reason().find("1.5 GB/s measured, 20 GFLOP/s a rank and 3 ns of its compute a byte sent "
                                     "measured"),
            std::string::npos)
      << j.strategy_reason();
  EXPECT_NE(j.strategy_reason().find("at 1 ranks"), std::string::npos) << j.strategy_reason();
  sent = DecodeJobConfig(a.Starts().back().spec(), job);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(StrategyName(sent->parallelism.strategy), j.strategy());
  EXPECT_EQ(j.attempts(1).strategy(), j.strategy());
}

// strategy = "auto" across two hosts of two ranks each. The first attempt
// picks on the defaults (no link measured yet). Once every rank measured a
// slow link between the hosts, the job stops and restarts at once with a
// hybrid whose shard group is a host's ranks (numbered consecutively); the
// resolved spec and the ownership map both say so, and no restart of
// max_restarts was spent. That attempt picked on a measurement, so it is
// not picked again.
TEST_F(RestartTest, AutoPicksAgainOnTheLinkItsRanksMeasured) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c, d;
  const int64_t memory = int64_t{16} << 30;
  const std::vector<std::string> ids = {AddWorker("h1", "cpu", &a, memory), AddWorker("h1", "cpu", &b, memory),
                                        AddWorker("h2", "cpu", &c, memory), AddWorker("h2", "cpu", &d, memory)};
  std::string spec = kRestartSpec;
  spec.replace(spec.find("workers = 3\nmin_workers = 2"), 27, "workers = 4\nmin_workers = 4");
  spec += "[parallelism]\nstrategy = \"auto\"\n";
  const std::string job = SubmitRestartable(spec);
  ASSERT_EQ(State(job), "RUNNING");
  ASSERT_EQ(core_->GetJob(job)->strategy().rfind("hybrid", 0), std::string::npos)
      << "the defaults already pick a hybrid: " << core_->GetJob(job)->strategy_reason();
  auto connect = [&](double bus_bandwidth) {
    for (int rank = 0; rank < 4; ++rank) {
      v1::RankConnected connected;
      connected.set_job_id(job);
      connected.set_rank(rank);
      connected.set_bus_bandwidth(bus_bandwidth);
      core_->OnConnected(ids[rank], connected);
    }
  };
  connect(1e6);  // 8 Mbit/s between the hosts
  v1::Job j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RESTARTING) << j.message();
  EXPECT_EQ(j.attempts(0).end().rfind("stopped after its rendezvous: on the 0.001 GB/s its ranks measured, auto picks "
                                      "hybrid_shard", 0),
            0u)
      << j.attempts(0).end();
  for (RecordingChannel* ch : {&a, &b, &c, &d}) EXPECT_EQ(ch->Cancels(), 1);
  for (int rank = 0; rank < 4; ++rank) Finish(ids[rank], job, rank, false, "cancelled", absl::StatusCode::kCancelled);
  core_->Tick(absl::Now() + absl::Milliseconds(60));
  j = *core_->GetJob(job);
  ASSERT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.strategy().rfind("hybrid_shard", 0), 0u) << j.strategy_reason();
  EXPECT_NE(j.strategy_reason().find("(shard groups of 2, one a host)"), std::string::npos) << j.strategy_reason();
  EXPECT_NE(j.strategy_reason().find("0.001 GB/s measured"), std::string::npos) << j.strategy_reason();
  for (RecordingChannel* ch : {&a, &d}) {
    absl::StatusOr<JobConfig> sent = DecodeJobConfig(ch->Starts().back().spec(), job);
    ASSERT_TRUE(sent.ok()) << sent.status();
    EXPECT_EQ(StrategyName(sent->parallelism.strategy), j.strategy());
    EXPECT_EQ(sent->parallelism.shard_group_size, 2);
  }
  absl::StatusOr<v1::Ownership> owners = core_->GetOwnership(job);
  ASSERT_TRUE(owners.ok()) << owners.status();
  EXPECT_EQ(owners->shard_group_size(), 2);
  // Picked on a measurement: a faster link now changes nothing until a restart.
  connect(5e9);
  EXPECT_EQ(State(job), "RUNNING");
  EXPECT_EQ(core_->GetJob(job)->attempts_size(), 2);
}

// The checkpoint of the last step ends the job: it does not stop the ranks
// to grow onto a worker that came back (they would restart only to finish).
TEST_F(RestartTest, TheLastStepsCheckpointDoesNotGrowTheJob) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c, d;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  Commit(job, 2, {&a, &b, &c});
  core_->WorkerGone(wc, "session closed");
  Finish(wa, job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  Finish(wb, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  ASSERT_EQ(core_->GetJob(job)->workers(), 2);
  AddWorker("h4", "cpu", &d);
  Commit(job, 50, {&a, &b});  // [train] steps = 50
  const v1::Job j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING) << j.message();
  EXPECT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(a.Cancels(), 1);  // only the restart's
  EXPECT_TRUE(d.Starts().empty());
}

// Job.history: rank 0's steps, only where asked for, the run that counts
// after a restart, and bounded however long the job runs.
TEST_F(RestartTest, TheHistoryKeepsTheStepsThatCountWithinItsBound) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string wc = AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  for (int s = 1; s <= 5; ++s) Progress(wa, job, s);
  Progress(wb, job, 6);  // not rank 0's: refused
  EXPECT_EQ(core_->GetJob(job, /*history=*/true)->history_size(), 5);
  EXPECT_EQ(core_->GetJob(job)->history_size(), 0);
  EXPECT_EQ(core_->ListJobs().at(0).history_size(), 0);
  Commit(job, 2, {&a, &b, &c});
  core_->WorkerGone(wc, "session closed");
  Finish(wa, job, 0, false, "cancelled", absl::StatusCode::kCancelled);
  Finish(wb, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  ASSERT_EQ(State(job), "RUNNING");
  v1::Job j = *core_->GetJob(job, true);
  ASSERT_EQ(j.history_size(), 2);  // steps 3-5 are computed again
  EXPECT_EQ(j.history(1).step(), 2);
  const int last = CoordinatorCore::kMaxHistory + 500;
  for (int s = 3; s <= last; ++s) Progress(wa, job, s);
  j = *core_->GetJob(job, true);
  EXPECT_LE(j.history_size(), CoordinatorCore::kMaxHistory);
  EXPECT_GT(j.history_size(), CoordinatorCore::kMaxHistory / 2);
  EXPECT_EQ(j.history(0).step(), 1);
  EXPECT_EQ(j.history(j.history_size() - 1).step(), last);
  for (int i = 1; i < j.history_size(); ++i) ASSERT_LT(j.history(i - 1).step(), j.history(i).step());
}

// The history is written with the job's record (the next state change
// persists it) and read back by a coordinator that restarted; listings still
// leave it out, and the spec, which GetJob returns, too (a listing copies
// every job; a spec may be 256 KiB).
TEST_F(RestartTest, TheHistoryIsStoredWithTheJob) {
  Open(absl::ZeroDuration());
  RecordingChannel a, b, c;
  const std::string wa = AddWorker("h1", "cpu", &a);
  AddWorker("h2", "cpu", &b);
  AddWorker("h3", "cpu", &c);
  const std::string job = SubmitRestartable();
  for (int s = 1; s <= 3; ++s) Progress(wa, job, s);
  ASSERT_TRUE(core_->Cancel(job).ok());
  core_.reset();
  Open(absl::ZeroDuration());
  ASSERT_TRUE(core_->Recover().ok());
  const v1::Job j = *core_->GetJob(job, /*history=*/true);
  ASSERT_EQ(j.history_size(), 3);
  EXPECT_EQ(j.history(2).step(), 3);
  EXPECT_EQ(core_->GetJob(job)->history_size(), 0);
  EXPECT_EQ(core_->ListJobs().at(0).history_size(), 0);
  EXPECT_EQ(j.spec_toml(), kRestartSpec);
  EXPECT_EQ(core_->ListJobs().at(0).spec_toml(), "");
}

}  // namespace
}  // namespace shardline

