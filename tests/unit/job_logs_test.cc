// JobLogs alone: the per-rank tail, the total bound that drops the logs of
// the job that ended first (never a running job's), and sequence numbers.
#include "server/job_logs.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

namespace shardline {
namespace {

v1::LogLine Line(const std::string& job, int rank, const std::string& text) {
  v1::LogLine l;
  l.set_job_id(job);
  l.set_rank(rank);
  l.set_unix_ms(1000);
  l.set_text(text);
  return l;
}

// Jobs' end times (absent: running).
struct Ends {
  std::map<std::string, int64_t> at;
  JobLogs::EndedAt Fn() const {
    return [this](const std::string& id) -> std::optional<int64_t> {
      auto it = at.find(id);
      if (it == at.end()) return std::nullopt;
      return it->second;
    };
  }
};

std::vector<std::string> Texts(const JobLogs& logs, const std::string& job, int rank, int64_t after) {
  v1::GetLogsResponse out;
  logs.Read(job, rank, after, &out);
  std::vector<std::string> texts;
  for (const auto& l : out.lines()) texts.push_back(l.text());
  return texts;
}

TEST(JobLogs, EachRankKeepsItsNewestLinesAndReadsComeInArrivalOrder) {
  JobLogs logs(JobLogs::Limits{64, 3, 1 << 20});
  Ends ends;
  for (int i = 0; i < 5; ++i) {
    logs.Append(Line("job-1", 0, absl::StrCat("r0 ", i)), ends.Fn());
    if (i == 1) logs.Append(Line("job-1", 1, "r1 first"), ends.Fn());
  }
  // Rank 0's two oldest are gone; rank 1's line (seq 3) sorts between.
  EXPECT_EQ(Texts(logs, "job-1", -1, 0), (std::vector<std::string>{"r1 first", "r0 2", "r0 3", "r0 4"}));
  EXPECT_EQ(Texts(logs, "job-1", 1, 0), (std::vector<std::string>{"r1 first"}));
  // After seq 4 (r0 2 is seq 4: r0 0, r0 1, r1 first, r0 2).
  EXPECT_EQ(Texts(logs, "job-1", -1, 4), (std::vector<std::string>{"r0 3", "r0 4"}));
  EXPECT_TRUE(Texts(logs, "job-2", -1, 0).empty());
}

TEST(JobLogs, ALineIsMadePrintableAndCut) {
  JobLogs logs(JobLogs::Limits{8, 10, 1 << 20});
  Ends ends;
  logs.Append(Line("job-1", 0, "a\x1b[2Jb"), ends.Fn());
  logs.Append(Line("job-1", 0, std::string(20, 'x')), ends.Fn());
  std::vector<std::string> t = Texts(logs, "job-1", 0, 0);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].find('\x1b'), std::string::npos);
  EXPECT_EQ(t[1], std::string(8, 'x') + "...");
}

TEST(JobLogs, OverTheTotalTheJobThatEndedFirstLosesItsLinesNeverARunningOne) {
  const v1::LogLine probe = [] {
    v1::LogLine l = Line("job-a", 0, std::string(100, 'x'));
    l.set_seq(1);
    return l;
  }();
  const size_t line_bytes = probe.ByteSizeLong();
  JobLogs logs(JobLogs::Limits{1024, 100, 5 * line_bytes});
  Ends ends;
  const std::string text(100, 'x');
  logs.Append(Line("job-a", 0, text), ends.Fn());
  logs.Append(Line("job-b", 0, text), ends.Fn());
  logs.Append(Line("job-c", 0, text), ends.Fn());
  logs.Append(Line("job-d", 0, text), ends.Fn());
  ends.at["job-a"] = 200;  // ended last
  ends.at["job-b"] = 100;  // ended first
  ends.at["job-c"] = 150;
  logs.Append(Line("job-d", 0, text), ends.Fn());
  EXPECT_EQ(logs.bytes(), 5 * line_bytes);  // at the bound, not over: nothing dropped
  logs.Append(Line("job-d", 0, text), ends.Fn());
  EXPECT_EQ(logs.bytes_of("job-b"), 0u);
  EXPECT_EQ(logs.bytes_of("job-a"), line_bytes);
  EXPECT_EQ(logs.bytes_of("job-c"), line_bytes);
  EXPECT_EQ(logs.bytes_of("job-d"), 3 * line_bytes);
  // Only running jobs left over the bound: they keep their tails.
  ends.at.erase("job-a");
  ends.at.erase("job-c");
  for (int i = 0; i < 3; ++i) logs.Append(Line("job-d", 0, text), ends.Fn());
  EXPECT_EQ(logs.bytes_of("job-d"), 6 * line_bytes);
  EXPECT_EQ(logs.bytes(), 8 * line_bytes);
}

TEST(JobLogs, SequenceNumbersAreNeverGivenTwice) {
  JobLogs logs(JobLogs::Limits{64, 1, 1 << 20});
  Ends ends;
  logs.Append(Line("job-1", 0, "a"), ends.Fn());
  logs.Append(Line("job-1", 0, "b"), ends.Fn());
  logs.Append(Line("job-2", 0, "c"), ends.Fn());
  v1::GetLogsResponse out;
  logs.Read("job-1", -1, 0, &out);
  ASSERT_EQ(out.lines_size(), 1);
  EXPECT_EQ(out.lines(0).seq(), 2);  // the first line dropped, its number not reused
  out.Clear();
  logs.Read("job-2", -1, 0, &out);
  EXPECT_EQ(out.lines(0).seq(), 1);  // per job
}

TEST(JobLogs, ForgettingAJobFreesItsBytes) {
  JobLogs logs;
  Ends ends;
  logs.Append(Line("job-1", 0, "a"), ends.Fn());
  logs.Append(Line("job-2", 0, "b"), ends.Fn());
  const size_t two = logs.bytes_of("job-2");
  logs.Forget("job-1");
  EXPECT_EQ(logs.bytes(), two);
  EXPECT_TRUE(Texts(logs, "job-1", -1, 0).empty());
}

}  // namespace
}  // namespace shardline
