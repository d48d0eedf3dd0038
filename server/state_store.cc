#include "server/state_store.h"

#include <sqlite3.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/base/quoted.h"

namespace shardline {

namespace {

// The schema's version, kept in meta; a database of a later one is refused.
constexpr int kSchemaVersion = 1;

// Every table, created whole with a new database and added (IF NOT EXISTS)
// to one written by an older coordinator.
constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, "
    "job BLOB, spec TEXT, base_dir TEXT)",
    "CREATE TABLE IF NOT EXISTS checkpoint_reports (job_id TEXT, rank INTEGER, step INTEGER, "
    "report BLOB, PRIMARY KEY (job_id, rank, step))",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER)",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)",
};

absl::StatusCode CodeOf(int rc) {
  switch (rc & 0xff) {  // the primary code of an extended one
    case SQLITE_FULL:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

// sqlite3_exec on a connection of our own (not yet a StateStore's).
absl::Status ExecOn(sqlite3* db, const std::string& path, const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return absl::OkStatus();
  std::string msg = err ? err : sqlite3_errstr(rc);
  sqlite3_free(err);
  return absl::Status(CodeOf(rc), absl::StrCat(path, ": ", msg));
}

absl::Status FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat(path, ": cannot open to sync: ", std::strerror(errno)));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return absl::InternalError(absl::StrCat(path, ": fsync: ", std::strerror(err)));
  return absl::OkStatus();
}

// Takes the state directory's lock (state_store.h) and writes this process's
// pid into it for the next one's message. Returns the descriptor that holds it.
absl::StatusOr<int> LockStateDir(const std::string& lock_path) {
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(lock_path, ": cannot open the state directory's lock file: ", std::strerror(errno)));
  }
  // Never waited on: a second coordinator stops at once.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      return absl::UnavailableError(absl::StrCat(lock_path, ": cannot lock: ", std::strerror(err)));
    }
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    int64_t pid = 0;
    std::string holder;
    if (n > 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)), &pid) && pid > 0) {
      holder = absl::StrCat(" (pid ", pid, ")");
    }
    return absl::FailedPreconditionError(absl::StrCat(lock_path, ": another coordinator", holder,
                                                      " is using this state directory; only one may run on it"));
  }
  ::fchmod(fd, 0600);
  // Best effort: a lock file without a pid (a full disk) still locks.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  return fd;
}

// A new state: the database is built whole under "<path>.new" (a stale one,
// left by a crash here, is replaced) and renamed into place, so that a
// database file that exists always holds the schema (state_store.h).
absl::Status CreateDatabase(const std::string& dir, const std::string& path) {
  const std::string tmp = path + ".new";
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    const std::string f = tmp + suffix;
    if (::unlink(f.c_str()) != 0 && errno != ENOENT) {
      return absl::PermissionDeniedError(absl::StrCat(f, ": cannot remove a stale one: ", std::strerror(errno)));
    }
  }
  // 0600 from the start (SQLite gives its WAL and shared-memory files the same mode).
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  ::close(fd);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(tmp.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat(tmp, ": cannot open: ", msg));
  }
  absl::Status s = ExecOn(db, tmp, "PRAGMA journal_mode=WAL");
  if (s.ok()) s = ExecOn(db, tmp, "BEGIN");
  for (const char* sql : kSchema) {
    if (s.ok()) s = ExecOn(db, tmp, sql);
  }
  if (s.ok()) {
    const std::string meta = absl::StrCat("INSERT INTO meta VALUES ('schema', '", kSchemaVersion,
                                          "'), ('created_unix_s', '", static_cast<int64_t>(::time(nullptr)), "')");
    s = ExecOn(db, tmp, meta.c_str());
  }
  if (s.ok()) s = ExecOn(db, tmp, "COMMIT");
  // The last connection's close checkpoints the WAL into the file and removes it.
  if (sqlite3_close(db) != SQLITE_OK && s.ok()) s = absl::InternalError(absl::StrCat(tmp, ": cannot close"));
  if (s.ok()) s = FsyncPath(tmp, O_RDONLY);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::InternalError(absl::StrCat(path, ": cannot rename ", tmp, " into place: ", std::strerror(errno)));
  }
  if (s.ok()) s = FsyncPath(dir, O_RDONLY | O_DIRECTORY);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

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
  // The lock before anything is read or created: two coordinators starting
  // at once on a new directory do not both create it.
  const std::string lock_path = dir + "/coordinator.lock";
  absl::StatusOr<int> lock_fd = LockStateDir(lock_path);
  if (!lock_fd.ok()) return lock_fd.status();
  const std::string path = dir + "/coordinator.db";
  auto fail = [&](absl::Status s) {
    ::close(*lock_fd);
    return s;
  };
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return fail(absl::PermissionDeniedError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno))));
    }
    // No database file: a new state.
    if (absl::Status s = CreateDatabase(dir, path); !s.ok()) return fail(s);
    if (::lstat(path.c_str(), &st) != 0) {
      return fail(absl::InternalError(absl::StrCat(path, ": gone after it was created: ", std::strerror(errno))));
    }
  } else if (!S_ISREG(st.st_mode)) {
    return fail(absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file")));
  } else {
    ::chmod(path.c_str(), 0600);  // an existing one is tightened
  }
  sqlite3* db = nullptr;
  // No SQLITE_OPEN_CREATE: the file is there, and stays the one checked below.
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(absl::UnavailableError(absl::StrCat(path, ": cannot open: ", msg)));
  }
  std::unique_ptr<StateStore> s(new StateStore(db, path, lock_path, *lock_fd));  // closes both from here
  absl::MutexLock lock(&s->mu_);
  sqlite3_busy_timeout(db, 5000);
  // Before anything is written (setting WAL would write a header into an
  // empty file): is this a Shardline state at all?
  sqlite3_stmt* q = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'", -1, &q,
                         nullptr) != SQLITE_OK) {
    return s->Error("read the schema", sqlite3_errcode(db));
  }
  int rc = sqlite3_step(q);
  const bool has_jobs = rc == SQLITE_ROW && sqlite3_column_int(q, 0) > 0;
  sqlite3_finalize(q);
  if (rc != SQLITE_ROW) return s->Error("read the schema", rc);
  if (!has_jobs) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": ", st.st_size == 0 ? "the state database is empty (0 bytes)" : "holds no Shardline state (no jobs table)",
        "; not taken for a new state, whose job ids would repeat old ones: restore it from a backup, or move it "
        "away to start with no jobs"));
  }
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    if (absl::Status e = s->Exec(sql); !e.ok()) return e;
  }
  for (const char* sql : kSchema) {
    if (absl::Status e = s->Exec(sql); !e.ok()) return e;
  }
  // A database of an older coordinator gets its meta row; one of a later
  // schema is not read with this one's.
  if (absl::Status e = s->Exec(absl::StrCat("INSERT OR IGNORE INTO meta VALUES ('schema', '", kSchemaVersion, "')"));
      !e.ok()) {
    return e;
  }
  if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE name = 'schema'", -1, &q, nullptr) != SQLITE_OK) {
    return s->Error("read meta", sqlite3_errcode(db));
  }
  rc = sqlite3_step(q);
  const int version = rc == SQLITE_ROW ? sqlite3_column_int(q, 0) : 0;
  sqlite3_finalize(q);
  if (rc != SQLITE_ROW) return s->Error("read meta", rc);
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": written by a later coordinator (schema ", version,
                                                      "; this one reads ", kSchemaVersion, ")"));
  }
  return s;
}

StateStore::~StateStore() {
  {
    absl::MutexLock lock(&mu_);
    sqlite3_close(db_);
  }
  ::close(lock_fd_);  // releases the lock, after the database is closed
}

absl::Status StateStore::Error(const std::string& what, int rc) {
  // sqlite3_errmsg says more (which constraint, which file), if it is of rc.
  const char* cause = (sqlite3_errcode(db_) & 0xff) == (rc & 0xff) ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  return absl::Status(CodeOf(rc), absl::StrCat(path_, ": ", what, ": ", cause));
}

absl::Status StateStore::Exec(const std::string& sql) { return ExecOn(db_, path_, sql.c_str()); }

void StateStore::SimulateFullDiskForTesting(bool full, int after_writes) {
  absl::MutexLock lock(&mu_);
  simulate_full_ = full;
  writes_before_full_ = after_writes;
}

absl::Status StateStore::SimulatedFailure(const std::string& what) {
  if (!simulate_full_) return absl::OkStatus();
  if (writes_before_full_ > 0) {
    --writes_before_full_;
    return absl::OkStatus();
  }
  return absl::Status(CodeOf(SQLITE_FULL), absl::StrCat(path_, ": ", what, ": ", sqlite3_errstr(SQLITE_FULL)));
}

absl::Status StateStore::PutJob(const StoredJob& j) {
  absl::MutexLock lock(&mu_);
  const std::string what = "write job " + j.job.id();
  if (absl::Status f = SimulatedFailure(what); !f.ok()) return f;
  sqlite3_stmt* st = nullptr;
  const char* sql =
      "INSERT INTO jobs (id, job, spec, base_dir) VALUES (?1, ?2, ?3, ?4) "
      "ON CONFLICT(id) DO UPDATE SET job = excluded.job";
  if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return Error("prepare", sqlite3_errcode(db_));
  const std::string blob = j.job.SerializeAsString();
  sqlite3_bind_text(st, 1, j.job.id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_blob(st, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 3, j.spec_toml.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 4, j.base_dir.c_str(), -1, SQLITE_TRANSIENT);
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? absl::OkStatus() : Error(what, rc);
}

absl::StatusOr<std::vector<JobRow>> StateStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT seq, id, job, spec, base_dir FROM jobs ORDER BY seq", -1, &st, nullptr) !=
      SQLITE_OK) {
    return Error("prepare", sqlite3_errcode(db_));
  }
  std::vector<JobRow> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    JobRow row;
    row.seq = sqlite3_column_int64(st, 0);
    // Any column may be NULL or of another type in a row written by hand or
    // damaged: each is checked, none is assumed.
    if (sqlite3_column_type(st, 1) != SQLITE_NULL) {
      const unsigned char* id = sqlite3_column_text(st, 1);
      if (id != nullptr) row.id.assign(reinterpret_cast<const char*>(id), sqlite3_column_bytes(st, 1));
    }
    std::vector<std::string> problems;
    if (row.id.empty()) problems.push_back("its id is NULL or empty");
    if (sqlite3_column_type(st, 2) == SQLITE_NULL) {
      problems.push_back("its job record is NULL");
    } else if (!row.stored.job.ParseFromArray(sqlite3_column_blob(st, 2), sqlite3_column_bytes(st, 2))) {
      problems.push_back("its job record does not parse");
    } else if (!row.id.empty() && row.stored.job.id() != row.id) {
      problems.push_back(absl::StrCat("its job record is of job ", Quoted(row.stored.job.id())));
    } else if (!row.id.empty()) {
      row.job_read = true;
    }
    if (!row.job_read) row.stored.job.Clear();
    row.stored.job.clear_spec_toml();  // rows written before the spec was kept once hold it twice
    if (const unsigned char* spec = sqlite3_column_text(st, 3); spec != nullptr) {
      row.stored.spec_toml.assign(reinterpret_cast<const char*>(spec), sqlite3_column_bytes(st, 3));
      row.spec_read = true;
    } else {
      problems.push_back("its spec is NULL");
    }
    if (const unsigned char* base = sqlite3_column_text(st, 4); base != nullptr) {
      row.stored.base_dir.assign(reinterpret_cast<const char*>(base), sqlite3_column_bytes(st, 4));
    } else {
      row.stored.base_dir = row.stored.job.base_dir();  // the same, kept in the record too
    }
    if (!problems.empty()) {
      row.problem = absl::StrCat(path_, ": the row of ", row.id.empty() ? "no id" : Quoted(row.id), " (seq ",
                                 row.seq, "): ", absl::StrJoin(problems, "; "));
    }
    out.push_back(std::move(row));
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return Error("read jobs", rc);
  return out;
}

absl::Status StateStore::PutCheckpointReport(const v1::CheckpointReport& r) {
  absl::MutexLock lock(&mu_);
  const std::string what = absl::StrCat("write the checkpoint report of job ", r.job_id(), " rank ", r.rank(),
                                        " step ", r.step());
  if (absl::Status f = SimulatedFailure(what); !f.ok()) return f;
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO checkpoint_reports VALUES (?1, ?2, ?3, ?4)", -1, &st,
                         nullptr) != SQLITE_OK) {
    return Error("prepare", sqlite3_errcode(db_));
  }
  const std::string blob = r.SerializeAsString();
  sqlite3_bind_text(st, 1, r.job_id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(st, 2, r.rank());
  sqlite3_bind_int64(st, 3, r.step());
  sqlite3_bind_blob(st, 4, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? absl::OkStatus() : Error(what, rc);
}

absl::StatusOr<int64_t> StateStore::NextJobNumber() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT value FROM counters WHERE name = 'next_job'", -1, &st, nullptr) != SQLITE_OK) {
    return Error("prepare", sqlite3_errcode(db_));
  }
  const int rc = sqlite3_step(st);
  const int64_t n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("read next_job", rc);
  return n;
}

absl::Status StateStore::DeleteJob(const std::string& id, int64_t next_job_number) {
  absl::MutexLock lock(&mu_);
  const std::string what = "delete job " + id;
  if (absl::Status f = SimulatedFailure(what); !f.ok()) return f;
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  for (const char* sql : {"DELETE FROM jobs WHERE id = ?1", "DELETE FROM checkpoint_reports WHERE job_id = ?1",
                          "INSERT INTO counters VALUES ('next_job', ?2) "
                          "ON CONFLICT(name) DO UPDATE SET value = max(value, excluded.value)"}) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) {
      absl::Status e = Error("prepare", sqlite3_errcode(db_));
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
      absl::Status e = Error(what, rc);
      (void)Exec("ROLLBACK");
      return e;
    }
  }
  return Exec("COMMIT");
}

}  // namespace shardline
