// The coordinator's state database (issue 24, defects 5 and 6), on real
// SQLite files in a temp dir: an emptied database is refused, not taken for
// a new one; a new job never takes an existing checkpoint directory; one
// coordinator per state directory; a row that does not read is named, kept
// unchanged and stops nothing; a state write that fails in a checkpoint
// commit fails the job at once naming the database, not a rank; failed
// writes leave one bounded note in the job's message.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/state/job_state.h"
#include "server/coordinator_core.h"
#include "server/state_store.h"
#include "tests/unit/core_fixture.h"

namespace shardline {
namespace {

using namespace testing_core;  // NOLINT: the fixture's names

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs `sql` on a connection of the test's own (as an operator's sqlite3 would).
void Sql(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << sql << ": " << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

// The first column of the first row of `sql` as text ("no row" if none):
// with quote(), a blob as X'..' and NULL as NULL.
std::string SqlText(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  std::string out = "no row";
  if (st != nullptr && sqlite3_step(st) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// Two workers, two restarts: a failure blamed on a rank would restart it.
const std::string kTwoRankSpec = TinySpec("workers = 2\nmax_restarts = 2\nrestart_timeout = 60", 50);

class StateDbTest : public CoreTest {
 protected:
  std::string db() const { return dir_ + "/coordinator.db"; }
  // The coordinator stops (its store closed, its lock released).
  void Stop() {
    core_.reset();
    store_.reset();
  }
  // The coordinator starts again on the same directory and recovers.
  void Start(CoordinatorOptions o = CoordinatorOptions{absl::Milliseconds(100), 3, absl::Milliseconds(50), absl::Milliseconds(50)}) {
    auto s = StateStore::Open(dir_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    core_ = std::make_unique<CoordinatorCore>(store_.get(), o);
    problems_.clear();
    ASSERT_TRUE(core_->Recover(&problems_).ok());
  }
  std::string SubmitSpec(const std::string& spec, const std::string& base_dir) {
    v1::SubmitJobRequest r;
    r.set_spec_toml(spec);
    r.set_base_dir(base_dir);
    auto id = core_->Submit(r);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }
  std::vector<std::string> problems_;
};

// Defect 5: a coordinator.db emptied to 0 bytes (or any SQLite file without
// the schema) is refused at start naming it; only a directory without a
// database file is a new state, created whole.
TEST_F(StateDbTest, AnEmptiedDatabaseIsRefusedNamingItNotTakenForANewOne) {
  Submit(1);
  Stop();
  std::filesystem::resize_file(db(), 0);
  ASSERT_FALSE(std::filesystem::exists(db() + "-wal"));  // a clean stop leaves no WAL behind
  auto reopened = StateStore::Open(dir_);
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reopened.status().message().rfind(db() + ": the state database is empty (0 bytes)", 0), 0u)
      << reopened.status();
  EXPECT_EQ(std::filesystem::file_size(db()), 0u);  // left as it was found
  // Another SQLite file is no state either.
  std::filesystem::remove(db());
  Sql(db(), "CREATE TABLE something_else (x)");
  reopened = StateStore::Open(dir_);
  ASSERT_FALSE(reopened.ok());
  EXPECT_TRUE(Contains(std::string(reopened.status().message()), db() + ": holds no Shardline state"))
      << reopened.status();
  // No file at all: a new state, with its schema and meta row from the start.
  std::filesystem::remove(db());
  Start();
  EXPECT_EQ(SqlText(db(), "SELECT quote(value) FROM meta WHERE name = 'schema'"), "'1'");
  EXPECT_FALSE(std::filesystem::exists(db() + ".new"));
  EXPECT_EQ(std::filesystem::status(db()).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  // A database of an older coordinator (a jobs table, no meta) is taken and given one.
  Stop();
  std::filesystem::remove(db());
  Sql(db(), "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, job BLOB, spec TEXT, "
            "base_dir TEXT)");
  Start();
  EXPECT_EQ(SqlText(db(), "SELECT quote(value) FROM meta WHERE name = 'schema'"), "'1'");
}

// Defect 5: whatever the database says, a new job never writes into a
// checkpoint directory that exists: with the database gone (a new state),
// ids start at job-1 again, but job-1's directory holds an old job's
// committed checkpoint, so the new job is job-2.
TEST_F(StateDbTest, ANewJobNeverTakesAnExistingCheckpointDirectory) {
  const std::string old_step = dir_ + "/ckpt/job-1/step-00000002";
  std::filesystem::create_directories(old_step);
  std::ofstream(old_step + "/manifest.json") << "{\"the old job\": true}";
  const std::string job = SubmitSpec(kSpec, dir_);
  EXPECT_EQ(job, "job-2");
  EXPECT_EQ(core_->GetJob(job)->checkpoint_root(), dir_ + "/ckpt/job-2");
  // An empty directory left behind counts too: the id after it.
  std::filesystem::create_directories(dir_ + "/ckpt/job-3");
  EXPECT_EQ(SubmitSpec(kSpec, dir_), "job-4");
  std::ifstream in(old_step + "/manifest.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "{\"the old job\": true}");
}

// Defect 5: one coordinator per state directory. A second store on it,
// from this process or another, is refused at once naming the lock file and
// the pid holding it; once the first is gone, it opens.
TEST_F(StateDbTest, OnlyOneCoordinatorOpensAStateDirectory) {
  auto second = StateStore::Open(dir_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(second.status().message()),
            absl::StrCat(dir_, "/coordinator.lock: another coordinator (pid ", getpid(),
                         ") is using this state directory; only one may run on it"));
  EXPECT_EQ(store_->lock_path(), dir_ + "/coordinator.lock");
  // Another process: the child's flock conflicts with the parent's.
  const pid_t child = fork();
  if (child == 0) {
    auto s = StateStore::Open(dir_);
    _exit(!s.ok() && absl::IsFailedPrecondition(s.status()) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  Stop();
  auto after = StateStore::Open(dir_);
  EXPECT_TRUE(after.ok()) << after.status();
}

// Defect 5: a row whose spec is NULL made the coordinator segfault at start.
// Now it is named, kept unchanged, listed FAILED; the other jobs serve.
TEST_F(StateDbTest, ARowWithANullSpecIsNamedAndKeptAndTheOthersServe) {
  const std::string a = Submit(1), b = Submit(1), c = Submit(1);
  ASSERT_TRUE(core_->Cancel(c).ok());
  Stop();
  Sql(db(), "UPDATE jobs SET spec = NULL WHERE id IN ('job-2', 'job-3')");
  const std::string before = SqlText(db(), "SELECT quote(job) FROM jobs WHERE id = 'job-2'");
  CoordinatorOptions o{absl::Milliseconds(100), 3, absl::Milliseconds(50), absl::Milliseconds(50)};
  o.keep_finished_for = absl::Hours(1);  // ended jobs are forgotten after an hour
  Start(o);
  // job-2 had not ended: it cannot run without its spec.
  v1::Job j = *core_->GetJob(b);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(j.message(), absl::StrCat("the coordinator cannot read this job's record: ", db(),
                                      ": the row of \"job-2\" (seq 2): its spec is NULL; the row is kept unchanged "
                                      "for the operator"));
  // job-3 had ended: it loads as it ended.
  EXPECT_EQ(core_->GetJob(c)->state(), v1::JOB_STATE_CANCELLED);
  ASSERT_EQ(problems_.size(), 2u);
  EXPECT_TRUE(Contains(problems_[0], "\"job-2\" (seq 2): its spec is NULL; kept unchanged, listed as job-2 (FAILED)"))
      << problems_[0];
  EXPECT_TRUE(Contains(problems_[1], "\"job-3\" (seq 3): its spec is NULL; loaded as it ended (CANCELLED)"))
      << problems_[1];
  // The others serve: job-1 runs on a worker.
  RecordingChannel w;
  AddWorker("h", "cpu", &w);
  EXPECT_EQ(State(a), "RUNNING");
  EXPECT_EQ(w.Starts().at(0).job_id(), a);
  // The bad row is the operator's: not deleted, not retired, not rewritten,
  // and its id is never given again.
  EXPECT_EQ(core_->Delete(b, true).status().code(), absl::StatusCode::kFailedPrecondition);
  core_->Tick(absl::Now() + absl::Hours(24 * 365));  // a year on: every ended job is past its hour
  EXPECT_EQ(core_->GetJob(c).status().code(), absl::StatusCode::kNotFound);  // forgotten
  EXPECT_EQ(core_->GetJob(b)->state(), v1::JOB_STATE_FAILED);                // kept
  EXPECT_EQ(SubmitSpec(kSpec, ""), "job-4");
  Stop();
  EXPECT_EQ(SqlText(db(), "SELECT count(*) FROM jobs WHERE id = 'job-3'"), "0");
  EXPECT_EQ(SqlText(db(), "SELECT quote(spec) FROM jobs WHERE id = 'job-2'"), "NULL");
  EXPECT_EQ(SqlText(db(), "SELECT quote(job) FROM jobs WHERE id = 'job-2'"), before);
}

// Defect 5: one row that does not parse stopped the whole coordinator
// without naming it. Now it is named (the start log, and a FAILED job),
// kept byte for byte, and the rest serve; so is a row without an id.
TEST_F(StateDbTest, AnUnparsableRowIsNamedKeptAndTheRestServe) {
  const std::string a = Submit(1), b = Submit(1), c = Submit(1);
  Stop();
  Sql(db(), "UPDATE jobs SET job = x'ffffffff0a' WHERE id = 'job-2'");
  Sql(db(), "INSERT INTO jobs (id, job, spec, base_dir) VALUES (NULL, x'', 'x', '')");
  Start();
  EXPECT_EQ(core_->GetJob(a)->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(core_->GetJob(c)->state(), v1::JOB_STATE_PENDING);
  v1::Job j = *core_->GetJob(b);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(Contains(j.message(), db() + ": the row of \"job-2\" (seq 2): its job record does not parse"))
      << j.message();
  v1::Job idless = *core_->GetJob("unreadable-row-4");
  EXPECT_EQ(idless.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(Contains(idless.message(), "the row of no id (seq 4): its id is NULL or empty")) << idless.message();
  ASSERT_EQ(problems_.size(), 2u);
  EXPECT_TRUE(Contains(problems_[0], "(seq 2): its job record does not parse; kept unchanged, listed as job-2"));
  EXPECT_EQ(core_->ListJobs().size(), 4u);
  RecordingChannel w1, w2;
  AddWorker("h1", "cpu", &w1);
  AddWorker("h2", "cpu", &w2);
  EXPECT_EQ(State(a), "RUNNING");
  EXPECT_EQ(State(c), "RUNNING");
  EXPECT_EQ(core_->Delete(b, false).status().code(), absl::StatusCode::kFailedPrecondition);
  Stop();
  EXPECT_EQ(SqlText(db(), "SELECT quote(job) FROM jobs WHERE id = 'job-2'"), "X'FFFFFFFF0A'");
  EXPECT_EQ(SqlText(db(), "SELECT count(*) FROM jobs WHERE id IS NULL"), "1");
}

// Defect 6: a checkpoint report the state database cannot save fails the
// job at once (no restart), naming the database and the cause, never the
// rank; the rank's own failure after it changes nothing.
TEST_F(StateDbTest, AFullStateDiskDuringACheckpointReportFailsTheJobAtOnceNamingTheDatabase) {
  RecordingChannel w1, w2;
  const std::string id1 = AddWorker("h1", "cpu", &w1), id2 = AddWorker("h2", "cpu", &w2);
  const std::string job = SubmitSpec(kTwoRankSpec, dir_);
  ASSERT_EQ(State(job), "RUNNING");
  store_->SimulateFullDiskForTesting(true);
  const v1::Assignment a1 = w1.Starts().back();
  absl::Status s = core_->ReportCheckpoint(ReportOf(job, a1, 2), a1.credential());
  EXPECT_FALSE(s.ok());
  v1::Job j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.message();
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.message().rfind(absl::StrCat("checkpoint of step 2 not committed: the coordinator could not save its "
                                           "state: ",
                                           db(), ": write the checkpoint report of job ", job, " rank 0 step 2: "
                                           "database or disk is full"),
                              0),
            0u)
      << j.message();
  EXPECT_FALSE(Contains(j.message(), "host")) << j.message();
  // The ranks were told to stop; their reports of the error change nothing.
  EXPECT_EQ(w1.Cancels(), 1);
  EXPECT_EQ(w2.Cancels(), 1);
  Finish(id1, job, 0, false, "checkpoint report: database or disk is full", absl::StatusCode::kInternal);
  Finish(id2, job, 1, false, "cancelled", absl::StatusCode::kCancelled);
  core_->Tick(absl::Now() + absl::Seconds(1));
  EXPECT_EQ(State(job), "FAILED");
  EXPECT_EQ(core_->GetJob(job)->restarts(), 0);
}

// Defect 6: the same when the reports were saved but the record that names
// the new checkpoint cannot be: the job fails at once and no manifest is
// written.
TEST_F(StateDbTest, AFullStateDiskDuringACommitFailsTheJobAtOnceWithoutAManifest) {
  RecordingChannel w1, w2;
  AddWorker("h1", "cpu", &w1);
  AddWorker("h2", "cpu", &w2);
  const std::string job = SubmitSpec(kTwoRankSpec, dir_);
  ASSERT_EQ(State(job), "RUNNING");
  const v1::Assignment a1 = w1.Starts().back(), a2 = w2.Starts().back();
  ASSERT_TRUE(core_->ReportCheckpoint(ReportOf(job, a1, 2), a1.credential()).ok());
  store_->SimulateFullDiskForTesting(true, /*after_writes=*/1);  // the last report is saved, the record not
  EXPECT_FALSE(core_->ReportCheckpoint(ReportOf(job, a2, 2), a2.credential()).ok());
  v1::Job j = *core_->GetJob(job);
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.message();
  EXPECT_EQ(j.restarts(), 0);
  EXPECT_EQ(j.message().rfind(absl::StrCat("checkpoint of step 2 not committed: the coordinator could not save its "
                                           "state: ",
                                           db(), ": write job ", job, ": database or disk is full"),
                              0),
            0u)
      << j.message();
  EXPECT_EQ(j.checkpoints_size(), 0);
  EXPECT_FALSE(std::filesystem::exists(j.checkpoint_root() + "/step-00000002/manifest.json"));
}

// Defect 6: every failed write appended its own "[state not saved: ...]"
// to the job's message (~420 B each second while a job ran on a full disk).
// Now one note, of the latest failure, within its bound, gone once a write
// succeeds.
TEST_F(StateDbTest, FailedStateWritesLeaveOneBoundedNote) {
  CoordinatorOptions o{absl::Milliseconds(100), 3, absl::Milliseconds(50), absl::Milliseconds(50)};
  o.persist_progress_every = absl::ZeroDuration();  // every progress is written
  core_ = std::make_unique<CoordinatorCore>(store_.get(), o);
  RecordingChannel w;
  const std::string wid = AddWorker("h", "cpu", &w);
  const std::string job = Submit(1);
  ASSERT_EQ(State(job), "RUNNING");
  const std::string clean = core_->GetJob(job)->message();
  auto progress = [&](int64_t step) {
    v1::Progress p;
    p.set_job_id(job);
    p.set_rank(0);
    p.set_step(step);
    core_->OnProgress(wid, p);
    return core_->GetJob(job)->message();
  };
  store_->SimulateFullDiskForTesting(true);
  const std::string first = progress(1);
  ASSERT_NE(first, clean);
  EXPECT_EQ(first, absl::StrCat(clean, " [state not saved: ", db(), ": write job ", job,
                                ": database or disk is full]"));
  for (int step = 2; step < 50; ++step) ASSERT_EQ(progress(step), first) << "step " << step;
  EXPECT_LE(first.size() - clean.size(), CoordinatorCore::kMaxUnsavedNoteBytes);
  // Once the state is written again, the note goes, from the record too.
  store_->SimulateFullDiskForTesting(false);
  EXPECT_EQ(progress(50), clean);
  Stop();
  Start();
  EXPECT_EQ(core_->GetJob(job)->step(), 50);
  EXPECT_FALSE(Contains(core_->GetJob(job)->message(), "state not saved")) << core_->GetJob(job)->message();
}

// A job that fails while the disk is full is FAILED in memory with the
// note; its record is written again every Tick, so once the disk has room
// the FAILED state is what a restarted coordinator reads (it came back
// RUNNING, and ran again).
TEST_F(StateDbTest, AStateReachedOnAFullDiskIsWrittenOnceTheDiskHasRoom) {
  RecordingChannel w;
  const std::string wid = AddWorker("h", "cpu", &w);
  const std::string job = Submit(1);
  ASSERT_EQ(State(job), "RUNNING");
  store_->SimulateFullDiskForTesting(true);
  Finish(wid, job, 0, false, "boom", absl::StatusCode::kInvalidArgument);  // its own error: FAILED at once
  ASSERT_EQ(State(job), "FAILED");
  EXPECT_TRUE(Contains(core_->GetJob(job)->message(), "[state not saved: ")) << core_->GetJob(job)->message();
  core_->Tick(absl::Now());  // the disk still full: still unsaved, nothing lost
  EXPECT_TRUE(Contains(core_->GetJob(job)->message(), "[state not saved: ")) << core_->GetJob(job)->message();
  store_->SimulateFullDiskForTesting(false);
  core_->Tick(absl::Now() + absl::Milliseconds(500));  // retried at most once a second
  EXPECT_TRUE(Contains(core_->GetJob(job)->message(), "[state not saved: ")) << core_->GetJob(job)->message();
  core_->Tick(absl::Now() + absl::Milliseconds(1100));
  EXPECT_FALSE(Contains(core_->GetJob(job)->message(), "state not saved")) << core_->GetJob(job)->message();
  Stop();
  Start();
  EXPECT_EQ(State(job), "FAILED");
  EXPECT_TRUE(Contains(core_->GetJob(job)->message(), "boom")) << core_->GetJob(job)->message();
}

// A job the state cannot record is not taken (it would vanish at the next
// start): Submit is refused naming the database and the cause.
TEST_F(StateDbTest, ASubmitTheStateCannotRecordIsRefusedNamingTheDatabase) {
  store_->SimulateFullDiskForTesting(true);
  v1::SubmitJobRequest r;
  r.set_spec_toml(kSpec);
  r.set_workers(1);
  auto id = core_->Submit(r);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(std::string(id.status().message()),
            absl::StrCat("job not accepted: the coordinator could not save its state: ", db(),
                         ": write job job-1: database or disk is full"));
  EXPECT_TRUE(core_->ListJobs().empty());
}

}  // namespace
}  // namespace shardline
