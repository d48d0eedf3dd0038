#include "server/state_store.h"

#include <sqlite3.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shardline {

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir) {
  // The state (job specs, checkpoint reports) is the coordinator's alone:
  // the directory is 0700 (an existing one is tightened) and the database
  // 0600 (SQLite gives its WAL and shared-memory files the same mode).
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create state directory: ", std::strerror(errno)));
  }
  if (chmod(dir.c_str(), 0700) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot make the state directory private: ",
                                                    std::strerror(errno)));
  }
  const std::string path = dir + "/coordinator.db";
  if (const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600); fd >= 0) {
    fchmod(fd, 0600);
    close(fd);
  }
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat(path, ": cannot open: ", msg));
  }
  std::unique_ptr<StateStore> s(new StateStore(db, path));
  absl::MutexLock lock(&s->mu_);
  sqlite3_busy_timeout(db, 5000);
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL",
                          "CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, "
                          "job BLOB, spec TEXT, base_dir TEXT)",
                          "CREATE TABLE IF NOT EXISTS checkpoint_reports (job_id TEXT, rank INTEGER, step INTEGER, "
                          "report BLOB, PRIMARY KEY (job_id, rank, step))",
                          "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER)"}) {
    absl::Status st = s->Exec(sql);
    if (!st.ok()) return st;
  }
  return s;
}

StateStore::~StateStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::Status StateStore::Error(const std::string& what) {
  return absl::InternalError(absl::StrCat(path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status StateStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "?";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat(path_, ": ", msg));
  }
  return absl::OkStatus();
}

absl::Status StateStore::PutJob(const StoredJob& j) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  const char* sql =
      "INSERT INTO jobs (id, job, spec, base_dir) VALUES (?1, ?2, ?3, ?4) "
      "ON CONFLICT(id) DO UPDATE SET job = excluded.job";
  if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return Error("prepare");
  const std::string blob = j.job.SerializeAsString();
  sqlite3_bind_text(st, 1, j.job.id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_blob(st, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 3, j.spec_toml.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 4, j.base_dir.c_str(), -1, SQLITE_TRANSIENT);
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? absl::OkStatus() : Error("write job " + j.job.id());
}

absl::StatusOr<std::vector<StoredJob>> StateStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT job, spec, base_dir FROM jobs ORDER BY seq", -1, &st, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  std::vector<StoredJob> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    StoredJob j;
    const void* blob = sqlite3_column_blob(st, 0);
    if (!j.job.ParseFromArray(blob, sqlite3_column_bytes(st, 0))) {
      sqlite3_finalize(st);
      return absl::DataLossError(absl::StrCat(path_, ": a job row does not parse"));
    }
    j.job.clear_spec_toml();  // rows written before the spec was kept once hold it twice
    j.spec_toml = reinterpret_cast<const char*>(sqlite3_column_text(st, 1));
    j.base_dir = reinterpret_cast<const char*>(sqlite3_column_text(st, 2));
    out.push_back(std::move(j));
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return Error("read jobs");
  return out;
}

absl::Status StateStore::PutCheckpointReport(const v1::CheckpointReport& r) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO checkpoint_reports VALUES (?1, ?2, ?3, ?4)", -1, &st,
                         nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  const std::string blob = r.SerializeAsString();
  sqlite3_bind_text(st, 1, r.job_id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(st, 2, r.rank());
  sqlite3_bind_int64(st, 3, r.step());
  sqlite3_bind_blob(st, 4, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? absl::OkStatus() : Error("write checkpoint report");
}

absl::StatusOr<int64_t> StateStore::NextJobNumber() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT value FROM counters WHERE name = 'next_job'", -1, &st, nullptr) != SQLITE_OK) {
    return Error("prepare");
  }
  const int rc = sqlite3_step(st);
  const int64_t n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("read next_job");
  return n;
}

absl::Status StateStore::DeleteJob(const std::string& id, int64_t next_job_number) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  for (const char* sql : {"DELETE FROM jobs WHERE id = ?1", "DELETE FROM checkpoint_reports WHERE job_id = ?1",
                          "INSERT INTO counters VALUES ('next_job', ?2) "
                          "ON CONFLICT(name) DO UPDATE SET value = max(value, excluded.value)"}) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) {
      absl::Status e = Error("prepare");
      (void)Exec("ROLLBACK");
      return e;
    }
    if (sqlite3_bind_parameter_index(st, "?1") > 0) {
      sqlite3_bind_text(st, 1, id.c_str(), -1, SQLITE_TRANSIENT);
    }
    if (sqlite3_bind_parameter_index(st, "?2") > 0) sqlite3_bind_int64(st, 2, next_job_number);
    const int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
      absl::Status e = Error("delete job " + id);
      (void)Exec("ROLLBACK");
      return e;
    }
  }
  return Exec("COMMIT");
}

}  // namespace shardline
