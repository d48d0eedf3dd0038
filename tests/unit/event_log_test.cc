// EventLog: each event is one line in either form whatever its values hold
// (spaces, quotes, newlines, invalid UTF-8); lines reach the output in
// order and all of them by the destructor; a stalled output drops lines
// (counted, said) rather than blocking Emit. CoreLog: the coordinator core
// logs a job's life (submitted, each state change with the reason, a
// cancel), workers joining and lost.
#include "server/event_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_split.h"
#include "tests/unit/core_fixture.h"

namespace shardline {
namespace {

using Json = nlohmann::ordered_json;
const absl::Time kWhen = absl::FromUnixMillis(1795598400123);  // 2026-11-25T09:20:00.123Z

TEST(EventLog, TextIsOneLineOfKeyValuesQuotedWhereNeeded) {
  const std::string line = EventLog::Format(
      LogFormat::kText, kWhen, "job_state",
      Json{{"job", "job-3"}, {"attempt", 2}, {"message", "rank 1 failed:\n\"bad\" shard"}, {"ok", true}});
  EXPECT_EQ(line, R"(2026-11-25T09:20:00.123Z job_state job=job-3 attempt=2 message="rank 1 failed:\n\"bad\" shard" ok=true)");
  EXPECT_EQ(EventLog::Format(LogFormat::kText, kWhen, "x", Json{{"empty", ""}, {"eq", "a=b"}}),
            R"(2026-11-25T09:20:00.123Z x empty="" eq="a=b")");
}

TEST(EventLog, JsonIsOneObjectPerLineEvenForInvalidUtf8) {
  const std::string line = EventLog::Format(LogFormat::kJson, kWhen, "job_submitted",
                                            Json{{"name", std::string("caf\xc3 \n x")}, {"workers", 4}});
  ASSERT_EQ(line.find('\n'), std::string::npos) << line;
  const Json j = Json::parse(line);
  EXPECT_EQ(j["time"], "2026-11-25T09:20:00.123Z");
  EXPECT_EQ(j["event"], "job_submitted");
  EXPECT_EQ(j["workers"], 4);
  EXPECT_EQ(j["name"], "caf\xef\xbf\xbd \n x");  // U+FFFD for the stray byte
  EXPECT_EQ(j.begin().key(), "time");  // time and event first, then the fields in order
}

// Reads everything from `fd` until EOF.
std::string Drain(int fd) {
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) all.append(buf, n);
  return all;
}

TEST(EventLog, EveryLineArrivesInOrderByTheDestructor) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::string got;
  std::thread reader([&] { got = Drain(fds[0]); });
  {
    std::FILE* out = fdopen(fds[1], "w");
    ASSERT_NE(out, nullptr);
    {
      EventLog log(LogFormat::kJson, out);
      for (int i = 0; i < 1000; ++i) log.Emit("n", Json{{"i", i}});
    }
    std::fclose(out);
  }
  reader.join();
  close(fds[0]);
  std::vector<std::string> lines = absl::StrSplit(got, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(Json::parse(lines[i])["i"], i);
}

// Nothing reads the pipe while 20,000 lines are emitted: its buffer fills,
// the writer blocks, the queue of 8 fills, and Emit drops rather than
// waits (a blocking Emit would hang this test under the core's lock).
TEST(EventLog, AStalledOutputDropsLinesAndSaysHowMany) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::FILE* out = fdopen(fds[1], "w");
  ASSERT_NE(out, nullptr);
  constexpr int kEmitted = 20000;
  auto log = std::make_unique<EventLog>(LogFormat::kText, out, /*max_queued=*/8);
  for (int i = 0; i < kEmitted; ++i) log->Emit("n", Json{{"i", i}, {"pad", std::string(100, 'x')}});
  log->Emit("last", Json::object());
  std::string got;
  std::thread reader([&] { got = Drain(fds[0]); });
  log.reset();
  std::fclose(out);
  reader.join();
  close(fds[0]);
  int64_t written = 0, dropped = 0;
  for (absl::string_view l : absl::StrSplit(got, '\n', absl::SkipEmpty())) {
    if (l.find(" log_lines_dropped count=") != absl::string_view::npos) {
      dropped += std::stoll(std::string(l.substr(l.rfind('=') + 1)));
    } else {
      ++written;
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(written + dropped, kEmitted + 1) << "every emitted line was written or counted as dropped";
}

class CoreLog : public testing_core::CoreTest {
 protected:
  void SetUp() override {
    CoreTest::SetUp();
    CoordinatorOptions o{absl::Milliseconds(100), 3, absl::Milliseconds(50), absl::Milliseconds(50)};
    o.events.log = [this](std::string_view event, Json fields) {
      lines_.push_back(EventLog::Format(LogFormat::kText, kWhen, event, fields).substr(25));
    };
    core_.reset();
    core_ = std::make_unique<CoordinatorCore>(store_.get(), o);
  }
  std::vector<std::string> lines_;
};

TEST_F(CoreLog, AJobsLifeAndItsWorkersAreLogged) {
  testing_core::RecordingChannel a, b;
  const std::string wa = AddWorker("h1", "cpu", &a);
  const std::string wb = AddWorker("h2", "cpu", &b);
  const std::string job = Submit(2);
  ASSERT_TRUE(core_->Cancel(job).ok());
  core_->WorkerGone(wb, "session closed");
  const std::vector<std::string> want = {
      "worker_joined worker=" + wa + " host=h1 device=cpu running=\"\"",
      "worker_joined worker=" + wb + " host=h2 device=cpu running=\"\"",
      "job_submitted job=" + job + " name=job owner=\"\" workers=2 strategy=full_shard steps=5 resume_from=\"\" resumed_from_job=\"\"",
      "job_state job=" + job + " from=PENDING to=RUNNING attempt=1 message=\"running on 2 workers\"",
      "job_state job=" + job + " from=RUNNING to=CANCELLED attempt=1 message=\"cancelled by the user\"",
      // Still stopping its rank of the cancelled job when its session dropped.
      "worker_lost worker=" + wb + " host=h2 why=\"session closed\" job=" + job + " rank=1",
  };
  EXPECT_EQ(lines_, want);
}

}  // namespace
}  // namespace shardline
