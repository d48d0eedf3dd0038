// shardctl's rendering: the jobs table stays aligned whatever the names; a
// resumed job shows no loss or rate before its first step (not 0.0000), and
// where it came from; the epoch appears where the data's length is known.
#include "client/render.h"
#include "client/tensorboard_events.h"

#include <gtest/gtest.h>

#include "absl/strings/str_split.h"

namespace shardline::ctl {
namespace {

v1::Job Job(const std::string& id, const std::string& name, int64_t step) {
  v1::Job j;
  j.set_id(id);
  j.set_name(name);
  j.set_state(v1::JOB_STATE_RUNNING);
  j.set_step(step);
  j.set_steps(1000000);
  j.set_loss(2.5);
  j.set_tokens_per_second(step > 0 ? 1000 : 0);
  j.set_workers(2);
  j.set_message("running on 2 workers");
  return j;
}

TEST(Render, TheJobsTableStaysAlignedWithLongNames) {
  const std::string table = JobsTable({Job("job-1", "a", 3), Job("job-12", std::string(40, 'n'), 999999)});
  std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  const size_t state = lines[0].find("STATE"), from = lines[0].find("FROM");
  for (const std::string& l : lines) {
    EXPECT_EQ(l.find_first_not_of(' ', state), state) << table;  // a cell starts where its header does
    EXPECT_EQ(l[state - 1], ' ') << table;
    EXPECT_EQ(l[from - 1], ' ') << table;
  }
}

TEST(Render, AResumedJobShowsNoLossBeforeItsFirstStepAndWhereItCameFrom) {
  v1::Job j = Job("job-2", "resumed", 15);
  j.set_tokens_per_second(0);  // started at its checkpoint's step 15, nothing measured yet
  j.set_loss(0);
  j.set_resumed_from_job("job-1");
  j.set_resumed_from_step(15);
  j.set_resume_from("/ck/job-1/step-00000015");
  const std::string line = ProgressLine(j, -1);
  EXPECT_NE(line.find("loss -  - tok/s"), std::string::npos) << line;
  const std::string details = JobDetails(j);
  EXPECT_NE(details.find("loss      -\n"), std::string::npos) << details;
  EXPECT_NE(details.find("resumed   from job-1 at step 15 (/ck/job-1/step-00000015)"), std::string::npos) << details;
  EXPECT_NE(JobsTable({j}).find(" job-1 "), std::string::npos);
  EXPECT_EQ(JobObject(j)["resumed_from"]["job"], "job-1");
}

TEST(Render, TheEpochShowsWhereTheDataLengthIsKnown) {
  v1::Job j = Job("job-3", "passes", 10);
  EXPECT_EQ(JobDetails(j).find("epoch"), std::string::npos);  // synthetic data: no epoch
  EXPECT_TRUE(JobObject(j)["epoch"].is_null());
  j.set_batch_size(24);
  j.set_sequences_per_epoch(160);  // step 10: 240 sequences, 1.5 passes
  EXPECT_NE(JobDetails(j).find("epoch     1.50 (160 sequences per epoch; the data wrapped 1 time)"),
            std::string::npos)
      << JobDetails(j);
  EXPECT_EQ(JobObject(j)["epoch"], 1.5);
}

// The check value of CRC-32C (RFC 3720's, and every implementation's).
TEST(TensorBoard, Crc32cOfTheCheckString) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

}  // namespace
}  // namespace shardline::ctl
