// CheckpointCommitter: reports, commit (manifest last), keep_latest and
// interrupted saves (see the header).
#include "server/checkpoint_committer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/base/fault_injection.h"
#include "common/base/file_util.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/model/model_shapes.h"
#include "common/state/job_state.h"

namespace shardline {

namespace {

// The names the project itself writes in a step directory (the manifest, the
// ranks' files, and the temp files each is written through): the only ones
// the coordinator removes there.
bool IsOwnStepFile(absl::string_view name) {
  absl::ConsumeSuffix(&name, ".tmp");
  if (name == "manifest.json") return true;
  if (!absl::ConsumePrefix(&name, "rank-") || !absl::ConsumeSuffix(&name, ".safetensors")) return false;
  auto digits = [](absl::string_view s, size_t n) {
    return s.size() >= n && s.find_first_not_of("0123456789") == absl::string_view::npos;
  };
  // RankFileName: "NNNNN" or "NNNNN.aNNNN" (a later attempt's).
  if (const size_t dot = name.find(".a"); dot != absl::string_view::npos) {
    return digits(name.substr(0, dot), 5) && digits(name.substr(dot + 2), 4);
  }
  return digits(name, 5);
}

// RemoveStepDir of the directory `name` inside the open directory `root_fd`
// (`dir` names it in errors). A symlink is never followed, and nothing but
// IsOwnStepFile names is removed: a directory holding anything else stays.
absl::Status RemoveStepDirAt(int root_fd, const std::string& name, const std::string& dir) {
  absl::StatusOr<UniqueFd> fd = OpenDirectoryNoFollow(root_fd, name, dir);
  if (!fd.ok()) return fd.status();
  // The manifest first: if it cannot go, the files it lists stay with it.
  if (::unlinkat(fd->get(), "manifest.json", 0) != 0 && errno != ENOENT) {
    return absl::PermissionDeniedError(absl::StrCat(dir, "/manifest.json: cannot remove: ", std::strerror(errno)));
  }
  DIR* d = ::fdopendir(fd->get());
  if (d == nullptr) return absl::InternalError(absl::StrCat(dir, ": cannot list: ", std::strerror(errno)));
  fd->release();  // closedir closes it
  std::vector<std::string> own;
  while (dirent* e = ::readdir(d)) {
    if (IsOwnStepFile(e->d_name)) own.push_back(e->d_name);
  }
  absl::Status s;
  for (const std::string& f : own) {
    // unlinkat removes a symlink itself, never what it points to.
    if (::unlinkat(::dirfd(d), f.c_str(), 0) != 0 && errno != ENOENT && s.ok()) {
      s = absl::PermissionDeniedError(absl::StrCat(dir, "/", f, ": cannot remove: ", std::strerror(errno)));
    }
  }
  if (::closedir(d) != 0 && s.ok()) s = absl::InternalError(absl::StrCat(dir, ": closedir: ", std::strerror(errno)));
  if (!s.ok()) return s;
  // Fails (ENOTEMPTY) where something the project did not write is left: it stays.
  if (::unlinkat(root_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOTEMPTY && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot remove: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

void RemoveStepDir(const std::string& dir) {
  const size_t slash = dir.rfind('/');
  const std::string root = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
  const std::string name = slash == std::string::npos ? dir : dir.substr(slash + 1);
  // The job's root is not followed either: the coordinator committed under
  // a real directory, and a link put there since leads to someone else's.
  absl::StatusOr<UniqueFd> root_fd = OpenDirectoryNoFollow(AT_FDCWD, root, root);
  // Nothing to tell (no caller has anyone to tell): what is left has no
  // manifest or stays a checkpoint, and a later RemoveInterruptedSaves or
  // Delete tries again.
  if (root_fd.ok()) (void)RemoveStepDirAt(root_fd->get(), name, dir);
}

absl::Status CheckpointCommitter::CheckReport(const v1::Job& j, const v1::CheckpointReport& report) {
  const std::string who = absl::StrCat("job ", j.id(), " rank ", report.rank());
  if (j.state() != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", j.id(), " is ", JobStateName(j.state()), ": it takes no checkpoints"));
  }
  if (report.rank() < 0 || report.rank() >= j.workers()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": no such rank (the job has ", j.workers(), ")"));
  }
  if (report.step() < 1 || report.step() > j.steps()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": step ", report.step(), " is outside [1, ", j.steps(), "]"));
  }
  // The coordinator writes the manifest beside the files and later prunes
  // that directory: only the rank's own file under the job's own root is
  // accepted, so a report cannot point either anywhere else.
  const std::string expected = RankFilePath(j.checkpoint_root(), report.step(), report.rank(), j.attempts_size());
  if (report.path() != expected) {
    return absl::PermissionDeniedError(
        absl::StrCat(who, ": reported file ", report.path(), " is not the rank's checkpoint file ", expected));
  }
  const std::string& sum = report.checksum();
  if (sum.size() != 64 || sum.find_first_not_of("0123456789abcdef") != std::string::npos || report.size_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": the checksum must be 64 hex digits and the size >= 0"));
  }
  return absl::OkStatus();
}

int CheckpointCommitter::Add(const v1::CheckpointReport& report) {
  auto& step = reports_[report.job_id()][report.step()];
  step[report.rank()] = report;
  return static_cast<int>(step.size());
}

void CheckpointCommitter::EndStep(const std::string& job_id, int64_t step) {
  auto it = reports_.find(job_id);
  if (it == reports_.end()) return;
  it->second.erase(step);
  if (it->second.empty()) reports_.erase(it);
}

void CheckpointCommitter::DropReports(const std::string& job_id) { reports_.erase(job_id); }

bool CheckpointCommitter::Reporting(const std::string& job_id, int64_t step) const {
  auto it = reports_.find(job_id);
  return it != reports_.end() && it->second.count(step) > 0;
}

size_t CheckpointCommitter::pending_steps(const std::string& job_id) const {
  auto it = reports_.find(job_id);
  return it == reports_.end() ? 0 : it->second.size();
}

absl::Status CheckpointCommitter::Commit(v1::Job& j, const JobConfig& config, int64_t step, const Recorder& record) {
  absl::StatusOr<CheckpointManifest> made = NewManifest(j.id(), config, j.workers(), step);
  if (!made.ok()) return made.status();
  CheckpointManifest& m = *made;
  const std::string dir = absl::StrCat(j.checkpoint_root(), "/", StepDirName(step));
  auto job = reports_.find(j.id());
  if (job != reports_.end()) {
    auto reports = job->second.find(step);
    if (reports != job->second.end()) {
      for (const auto& [rank, rep] : reports->second) {
        m.ranks.push_back({rank, RankFileName(rank, j.attempts_size()), rep.size_bytes(), rep.checksum()});
      }
    }
  }
  // The record names the step before its manifest appears: a crash in
  // between leaves a recorded step without a manifest, which Recover drops,
  // never a committed step the record does not know (plain resume would take
  // an older one, and keep_latest would never prune it).
  v1::CheckpointInfo* info = j.add_checkpoints();
  info->set_step(step);
  info->set_path(dir);
  if (absl::Status saved = record.save_or_error(); !saved.ok()) {
    j.mutable_checkpoints()->RemoveLast();
    return absl::Status(saved.code(), absl::StrCat("the coordinator could not save its state: ", saved.message()));
  }
  // Only into the job's own step directory, never through a symlink: the
  // coordinator may run as root.
  absl::Status s = WriteManifestConfined(j.checkpoint_root(), m);
  if (!s.ok()) {
    j.mutable_checkpoints()->RemoveLast();
    record.save();
    return s;
  }
  // Pruning only once the new manifest is in place: until then the older
  // checkpoints are the newest committed ones.
  Prune(j, config.checkpoint.keep_latest, record);
  return absl::OkStatus();
}

void CheckpointCommitter::Prune(v1::Job& j, int keep, const Recorder& record) {
  // Oldest first; the newest committed one is never among those dropped.
  // The record is saved before anything is deleted: a crash in between
  // leaves a directory too many on disk, never a record of one that is gone
  // or a commit that was not recorded.
  std::vector<std::string> dropped;
  if (keep > 0 && j.checkpoints_size() > keep) {
    int excess = j.checkpoints_size() - keep;
    google::protobuf::RepeatedPtrField<v1::CheckpointInfo> kept;
    for (int i = 0; i < j.checkpoints_size(); ++i) {
      const v1::CheckpointInfo& c = j.checkpoints(i);
      if (excess > 0 && i < j.checkpoints_size() - 1 && !(in_use_ && in_use_(c.path()))) {
        dropped.push_back(c.path());
        --excess;
      } else {
        *kept.Add() = c;
      }
    }
    j.mutable_checkpoints()->Swap(&kept);
  }
  record.save();
  if (!dropped.empty()) InjectProcessFault("shardline-coordinator", "mid-prune", j.checkpoints(j.checkpoints_size() - 1).step());
  for (const std::string& dir : dropped) RemoveStepDir(dir);
  // Interrupted saves older than the newest commit.
  RemoveInterruptedSaves(j, j.checkpoints_size() ? j.checkpoints(j.checkpoints_size() - 1).step() : -1);
}

void CheckpointCommitter::RemoveInterruptedSaves(const v1::Job& j, int64_t below) const {
  const std::string& root = j.checkpoint_root();
  // A root that is a symlink is not the job's own directory: never followed.
  absl::StatusOr<UniqueFd> root_fd = OpenDirectoryNoFollow(AT_FDCWD, root, root);
  if (!root_fd.ok()) return;
  const int list_fd = ::dup(root_fd->get());
  if (list_fd < 0) return;
  DIR* d = ::fdopendir(list_fd);
  if (d == nullptr) {
    (void)::close(list_fd);  // read-only: nothing to lose
    return;
  }
  std::vector<std::string> partial;
  while (dirent* e = ::readdir(d)) {
    long long step = -1;
    char rest = 0;
    // Only the step directories this job's ranks write, and none whose
    // save is still being reported.
    if (sscanf(e->d_name, "step-%lld%c", &step, &rest) != 1 || step >= below || Reporting(j.id(), step)) continue;
    // Real directories only: a symlink planted under a step's name is not
    // the job's (d_type may be unknown on some file systems: ask lstat).
    struct stat st;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      is_dir = ::fstatat(root_fd->get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (!is_dir) continue;
    const std::string manifest = absl::StrCat(e->d_name, "/manifest.json");
    if (::fstatat(root_fd->get(), manifest.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
      partial.push_back(e->d_name);
    }
  }
  (void)::closedir(d);  // read-only: nothing to lose
  for (const std::string& name : partial) (void)RemoveStepDirAt(root_fd->get(), name, root + "/" + name);
}

}  // namespace shardline
