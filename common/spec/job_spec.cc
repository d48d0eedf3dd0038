#include "common/spec/job_spec.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"
#include "common/data/token_count.h"
#include "common/job/job_file.h"
#include "common/model/hf_config.h"
#include "common/model/lora_adapter.h"
#include "common/model/weight_source.h"

namespace shardline {

namespace {

void ResolvePaths(JobConfig& c, const std::string& base_dir) {
  for (TokenSource* s : {&c.data.train, &c.data.val}) {
    for (auto* list : {&s->paths, &s->mask_paths, &s->doc_paths}) {
      for (std::string& p : *list) p = ResolveJobPath(base_dir, p);
    }
  }
  c.model.init_from = ResolveJobPath(base_dir, c.model.init_from);
  c.model.hf_dir = ResolveJobPath(base_dir, c.model.hf_dir);
  c.lora.init_from = ResolveJobPath(base_dir, c.lora.init_from);
}

// The stream's size where it is on disk; then steps from [train] epochs.
// Missing files are left to CheckJobFiles (a spec resolves before its
// files exist, as shardctl plan resolves it).
absl::Status ResolveEpochs(JobConfig& c, const std::string& source) {
  TrainConfig& t = c.train;
  t.sequences_per_epoch = 0;
  if (c.data.format == DataFormat::kSynthetic) {
    if (t.epochs > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": [train] epochs: synthetic data is an endless stream; give [train] steps or data files"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> files = ExpandDataPaths(c.data.train.paths, "", "[data] path");
  absl::StatusOr<int64_t> tokens = files.ok() ? CountTokens(c.data.format, *files) : files.status();
  if (!tokens.ok()) {
    if (t.epochs > 0) {
      return absl::Status(tokens.status().code(),
                          absl::StrCat(source, ": [train] epochs needs the data's size: ", tokens.status().message()));
    }
    return absl::OkStatus();
  }
  if (c.model.block_size > 0) t.sequences_per_epoch = std::max<int64_t>(0, (*tokens - 1) / c.model.block_size);
  if (t.epochs <= 0) return absl::OkStatus();
  if (t.sequences_per_epoch == 0 || t.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": [train] epochs: the data holds ", *tokens,
                                                   " tokens, not one sequence of block_size + 1"));
  }
  const double steps = std::ceil(t.epochs * static_cast<double>(t.sequences_per_epoch) / t.batch_size);
  if (steps > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": [train] epochs = ", t.epochs, " is ", steps,
                                                   " steps of batch_size ", t.batch_size, ", more than 2^31 - 1"));
  }
  t.steps = std::max(1, static_cast<int>(steps));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobConfig> ResolveJobSpec(const std::string& toml_text, const std::string& source,
                                         const std::string& base_dir) {
  absl::StatusOr<JobConfig> c = ParseJobConfig(toml_text, source);
  if (!c.ok()) return c;
  ResolvePaths(*c, base_dir);
  absl::Status s = ApplyHfConfig(*c, source);
  if (s.ok()) s = ApplyPeftConfig(*c, source);
  if (s.ok()) s = ResolveEpochs(*c, source);
  if (!s.ok()) return s;
  return c;
}

absl::Status CheckJobFiles(const JobConfig& c, const std::string& source) {
  auto missing = [&](const char* key, const std::string& full) {
    struct stat st;
    if (stat(full.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat(source, ": ", key, ": ", Shown(full, 256), ": no such file"));
    }
    if (S_ISREG(st.st_mode)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, ": ", Shown(full, 256), ": not a regular file (",
                                                   S_ISDIR(st.st_mode) ? "a directory" : "a device or pipe", ")"));
  };
  const std::pair<const char*, const std::vector<std::string>*> lists[] = {
      {"[data] path", &c.data.train.paths}, {"[data] mask_path", &c.data.train.mask_paths},
      {"[data] val_path", &c.data.val.paths}, {"[data] val_mask_path", &c.data.val.mask_paths},
      {"[data] doc_path", &c.data.train.doc_paths}, {"[data] val_doc_path", &c.data.val.doc_paths}};
  for (const auto& [key, list] : lists) {
    if (c.data.format == DataFormat::kSynthetic) break;
    absl::StatusOr<std::vector<std::string>> files = ExpandDataPaths(*list, "", key);
    if (!files.ok()) return absl::Status(files.status().code(), absl::StrCat(source, ": ", files.status().message()));
  }
  if (!c.model.init_from.empty()) {
    absl::Status s = missing("[model] init_from", c.model.init_from);
    if (!s.ok()) return s;
  }
  for (const bool adapters : {false, true}) {
    absl::StatusOr<std::unique_ptr<WeightSource>> w =
        adapters ? WeightSource::OpenAdapters(c.model, c.lora) : WeightSource::Open(c.model);
    if (!w.ok()) return absl::Status(w.status().code(), absl::StrCat(source, ": ", w.status().message()));
    if (!*w) continue;
    absl::Status s = (*w)->Check();
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobConfig> ResolveJobFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path, "job file");
  if (!text.ok()) return text.status();
  std::error_code ec;
  const std::string base = std::filesystem::absolute(std::filesystem::path(path), ec).parent_path().string();
  return ResolveJobSpec(*text, path, base);
}

}  // namespace shardline
