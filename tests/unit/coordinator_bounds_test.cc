// What callers can make the coordinator hold and show every user: the
// store's and the queue's bounds, log tails, workers' text, submitted paths,
// and what a full queue costs each event.
#include "server/coordinator_core.h"
#include "tests/unit/core_fixture.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"

namespace shardline {
namespace {

using namespace testing_core;  // NOLINT: the fixture's names

TEST_F(CoreTest, TheStoreBoundsWhatCallersCanMakeItHold) {
  using Core = CoordinatorCore;
  // One value past the limit, then values up to the total: refused, and the
  // bytes of deleted keys are given back.
  absl::Status s = core_->StoreSet("job-1/big", std::string(Core::kMaxStoreValueBytes + 1, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("more than the limit of 1048576"), std::string::npos) << s;
  const std::string mib(Core::kMaxStoreValueBytes - 16, 'x');
  const size_t per_job = Core::kMaxJobStoreBytes / (mib.size() + 16);
  for (size_t i = 0; i < per_job; ++i) ASSERT_TRUE(core_->StoreSet("job-1/k" + std::to_string(i), mib).ok()) << i;
  s = core_->StoreSet("job-1/one-more", mib);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("bytes for job-1's keys"), std::string::npos) << s;
  ASSERT_TRUE(core_->StoreDelete("job-1/k0"));
  EXPECT_TRUE(core_->StoreSet("job-1/one-more", mib).ok());
  // Other jobs' keys still fit, up to the total of all jobs.
  const size_t jobs = Core::kMaxStoreBytes / Core::kMaxJobStoreBytes;
  for (size_t j = 2; j <= jobs; ++j) {
    for (size_t i = 0; i < per_job; ++i) {
      ASSERT_TRUE(core_->StoreSet(absl::StrCat("job-", j, "/k", i), mib).ok()) << j << " " << i;
    }
  }
  s = core_->StoreSet("job-99/k", mib);
  EXPECT_NE(s.message().find("bytes for all keys"), std::string::npos) << s;
  // A job's pending waits are bounded, and a wait that ends gives its place back.
  std::vector<absl::Status> waits(Core::kMaxJobWaiters + 1, absl::UnknownError("pending"));
  for (size_t i = 0; i < waits.size(); ++i) {
    core_->StoreWait({"job-3/never"}, absl::Now() + absl::Milliseconds(50),
                     [&waits, i](const absl::Status& st, const std::vector<std::string>&) { waits[i] = st; });
  }
  EXPECT_EQ(waits.back().code(), absl::StatusCode::kResourceExhausted) << waits.back();
  EXPECT_EQ(waits.front().code(), absl::StatusCode::kUnknown);  // still pending
  core_->Tick(absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(waits.front().code(), absl::StatusCode::kDeadlineExceeded);
  absl::Status again = absl::UnknownError("pending");
  core_->StoreWait({"job-3/never"}, absl::Now() + absl::Seconds(10),
                   [&](const absl::Status& st, const std::vector<std::string>&) { again = st; });
  EXPECT_EQ(again.code(), absl::StatusCode::kUnknown);  // accepted: pending
  EXPECT_EQ(core_->StoreSet(std::string(Core::kMaxStoreKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->StoreAdd("job-1/n", INT64_MAX).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ(core_->StoreAdd("job-1/n", 1).status().code(), absl::StatusCode::kOutOfRange);
  // A wait naming too many keys is refused at once.
  absl::Status waited = absl::UnknownError("pending");
  core_->StoreWait(std::vector<std::string>(Core::kMaxWaitKeys + 1, "k"), absl::Now() + absl::Seconds(10),
                   [&](const absl::Status& st, const std::vector<std::string>&) { waited = st; });
  EXPECT_EQ(waited.code(), absl::StatusCode::kResourceExhausted);
}

// No unbounded memory from a caller: the queue of jobs waiting to start is bounded.
TEST_F(CoreTest, TheQueueOfWaitingJobsIsBounded) {
  CoordinatorOptions o;
  o.max_queued_jobs = 2;
  core_ = std::make_unique<CoordinatorCore>(store_.get(), o);
  Submit(3);
  Submit(3);  // no workers: both wait
  v1::SubmitJobRequest r;
  r.set_spec_toml(kSpec);
  r.set_workers(3);
  absl::StatusOr<std::string> third = core_->Submit(r);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_NE(third.status().message().find("2 jobs waiting to start"), std::string::npos) << third.status();
  EXPECT_EQ(core_->ListJobs().size(), 2u);
}

// A job file past kMaxJobFileBytes is refused before it is parsed or stored,
// naming the file (shardctl refuses it before sending; a raw client reaches this).
TEST_F(CoreTest, AJobFilePastTheLimitIsRefused) {
  v1::SubmitJobRequest r;
  r.set_spec_toml(std::string(kSpec) + "\n#" + std::string(300 << 10, 'x') + "\n");
  r.set_source("huge.toml");
  absl::StatusOr<std::string> id = core_->Submit(r);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
  EXPECT_NE(id.status().message().find("huge.toml: the job file is"), std::string::npos) << id.status();
  EXPECT_NE(id.status().message().find("more than the limit of 262144"), std::string::npos) << id.status();
  EXPECT_TRUE(core_->ListJobs().empty());
}

// One user cannot fill the queue: past their own limit their submits are
// refused, while another user's still enter.
TEST_F(CoreTest, OneUsersWaitingJobsAreBounded) {
  CoordinatorOptions o;
  o.max_queued_jobs = 10;
  o.max_queued_jobs_per_user = 2;
  core_ = std::make_unique<CoordinatorCore>(store_.get(), o);
  v1::SubmitJobRequest r;
  r.set_spec_toml(kSpec);
  r.set_workers(3);  // no workers: every job waits
  ASSERT_TRUE(core_->Submit(r, "alice").ok());
  ASSERT_TRUE(core_->Submit(r, "alice").ok());
  absl::StatusOr<std::string> third = core_->Submit(r, "alice");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_NE(third.status().message().find("you already have 2 jobs waiting to start, the limit for one user"),
            std::string::npos)
      << third.status();
  EXPECT_TRUE(core_->Submit(r, "bob").ok());
  EXPECT_EQ(core_->ListJobs().size(), 3u);
}

// shardctl logs: a rank's lines are kept only from the session holding it,
// one line each, in a bounded tail per rank, and outlive the job.
TEST_F(CoreTest, LogLinesAreTheRanksOwnInABoundedTail) {
  RecordingChannel a, b;
  const std::string wa = AddWorker("h1", "cpu", &a), wb = AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  auto log = [&](const std::string& worker, int rank, const std::string& text) {
    v1::LogLine l;
    l.set_job_id(job);
    l.set_rank(rank);
    l.set_unix_ms(1000);
    l.set_text(text);
    core_->OnLog(worker, l);
  };
  log(wa, 0, "running as rank 0");
  log(wb, 1, "running as rank 1\nsecond line");
  log(wb, 0, "forged");  // wb does not hold rank 0
  v1::GetLogsResponse all = *core_->GetLogs(job, -1, 0);
  ASSERT_EQ(all.lines_size(), 2);
  EXPECT_EQ(all.lines(0).text(), "running as rank 0");
  EXPECT_EQ(all.lines(1).text(), "running as rank 1\\x0asecond line");
  EXPECT_EQ(all.lines(1).seq(), 2);
  EXPECT_FALSE(all.ended());
  EXPECT_EQ(core_->GetLogs(job, 1, 0)->lines_size(), 1);
  EXPECT_EQ(core_->GetLogs(job, -1, 1)->lines_size(), 1);  // after seq 1
  log(wa, 0, std::string(5000, 'x'));
  EXPECT_EQ(core_->GetLogs(job, 0, 2)->lines(0).text(), std::string(CoordinatorCore::kMaxLogLineBytes, 'x') + "...");
  for (size_t i = 0; i < CoordinatorCore::kLogLinesPerRank + 10; ++i) log(wa, 0, absl::StrCat("step ", i));
  v1::GetLogsResponse zero = *core_->GetLogs(job, 0, 0);
  EXPECT_EQ(zero.lines_size(), static_cast<int>(CoordinatorCore::kLogLinesPerRank));
  EXPECT_EQ(zero.lines(zero.lines_size() - 1).text(), absl::StrCat("step ", CoordinatorCore::kLogLinesPerRank + 9));
  ASSERT_TRUE(core_->Cancel(job).ok());
  EXPECT_TRUE(core_->GetLogs(job, -1, 0)->ended());
  EXPECT_EQ(core_->GetLogs(job, 1, 0)->lines_size(), 1);
  EXPECT_EQ(core_->GetLogs("job-99", -1, 0).status().code(), absl::StatusCode::kNotFound);
}

// Every string a worker sends is shown to every user: bounded and printable
// where it enters. Two 3 MB host names once made `shardctl workers` fail for
// everyone (a reply past the 4 MB limit); an escape in a host, a log line or a
// rank's error reached users' terminals.
TEST_F(CoreTest, AWorkersTextIsBoundedAndPrintableWhereItEnters) {
  RecordingChannel a;
  auto reg = [&](const std::string& host, const std::string& device) {
    v1::WorkerInfo info;
    info.set_host(host);
    info.set_device(device);
    return core_->RegisterWorker(info, &a).status();
  };
  absl::Status big = reg(std::string(3 << 20, 'h'), "cpu");
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big.message(), absl::StrCat("register: host \"", std::string(64, 'h'),
                                        "...\": at most 255 bytes of printable text"));
  EXPECT_EQ(reg("h\x1b]0;pwned\x07", "cpu").message(),
            "register: host \"h\\x1b]0;pwned\\x07\": at most 255 bytes of printable text");
  EXPECT_EQ(reg("h", "cpu\n0").message(), "register: device \"cpu\\n0\": at most 64 bytes of printable text");
  EXPECT_TRUE(core_->ListWorkers().empty());
  EXPECT_TRUE(reg("gpu-node-07.example", "cpu").ok());

  RecordingChannel b;
  AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  Finish(core_->GetJob(job)->worker_ids(1), job, 1, false, "boom\x1b[2J\nforged row", absl::StatusCode::kInternal);
  const std::string message = core_->GetJob(job)->message();
  EXPECT_NE(message.find("failed: boom\\x1b[2J\\x0aforged row"), std::string::npos) << message;
  EXPECT_TRUE(IsPrintable(message)) << message;
}

// A path of a submit (its source, base_dir, resume_from) is refused when it
// would act on a terminal, naming the field.
TEST_F(CoreTest, ASubmittedPathMustBePrintable) {
  v1::SubmitJobRequest r;
  r.set_spec_toml(kSpec);
  r.set_workers(1);
  r.set_resume_from("/ckpt/job-1/step-10\x1b[2J");
  absl::StatusOr<std::string> id = core_->Submit(r);
  EXPECT_EQ(id.status().message(),
            "resume_from \"/ckpt/job-1/step-10\\x1b[2J\": control characters are not allowed in a path");
  r.set_resume_from("");
  r.set_base_dir("/home/u/\xe2\x80\xae" "evil");
  EXPECT_EQ(core_->Submit(r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(core_->ListJobs().empty());
}

// A queue of jobs that cannot start (more workers asked for than are
// registered) is not walked at every event: a submit looks at the new job
// only, and the others are looked at again once a worker registers. (Every
// event once looked at all of them: 10,000 queued jobs cut submits from
// ~1,450/s to ~140/s.) Listing pages copy only the page, and a page token
// near 2^64 is past the end rather than wrapping to the start.
TEST_F(CoreTest, JobsThatCannotStartAreNotLookedAtAgainUntilTheRegistryChanges) {
  for (int i = 0; i < 200; ++i) Submit(4);
  const int64_t before = core_->start_attempts();
  Submit(4);
  EXPECT_EQ(core_->start_attempts() - before, 1);
  core_->Tick(absl::Now());
  EXPECT_EQ(core_->start_attempts() - before, 1);
  RecordingChannel a;
  AddWorker("h1", "cpu", &a);  // still too few: each is looked at once more
  EXPECT_EQ(core_->start_attempts() - before, 1 + 201);
  size_t total = 0;
  EXPECT_EQ(core_->ListJobs(199, 100, &total).size(), 2u);
  EXPECT_EQ(total, 201u);
  EXPECT_TRUE(core_->ListJobs(UINT64_MAX - 5, 100, &total).empty());
  EXPECT_EQ(core_->ListJobs(0, 100, &total).front().id(), "job-1");
}

}  // namespace
}  // namespace shardline
