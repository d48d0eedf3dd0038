#include "common/checkpoint/checkpoint_export.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/model/hf_config.h"
#include "common/model/lora_adapter.h"
#include "common/model/model_shapes.h"
#include "common/model/weight_source.h"

namespace shardline {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& step_dir) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->dir_ = step_dir;
  SL_ASSIGN_OR_RETURN(r->manifest_, ReadManifest(step_dir));
  return r;
}

absl::StatusOr<const SafetensorsReader*> CheckpointReader::RankFile(int rank) {
  auto it = files_.find(rank);
  if (it != files_.end()) return it->second.get();
  const ManifestRankFile* entry = nullptr;
  for (const auto& f : manifest_.ranks) {
    if (f.rank == rank) entry = &f;
  }
  if (!entry) return absl::DataLossError(absl::StrCat(dir_, ": manifest has no file for rank ", rank));
  const std::string path = dir_ + "/" + entry->file;
  // The name is a plain file name (ParseManifest); a symlink under it would
  // still lead out of the checkpoint (another step's file, or any file whose
  // hash the mismatch below would print), so it is not followed.
  SL_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFileNoFollow(path));
  SL_ASSIGN_OR_RETURN(std::string sha, Sha256OfOpenFile(fd.get(), path));
  if (sha != entry->sha256) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (sha256 ", sha.substr(0, 12),
                                            "..., manifest says ", entry->sha256.substr(0, 12), "...)"));
  }
  // Read through the descriptor that was verified: a file put under the name
  // since is never what is read.
  SL_ASSIGN_OR_RETURN(auto f, SafetensorsReader::FromOpenFile(std::move(fd), path));
  return (files_[rank] = std::move(f)).get();
}

absl::Status CheckpointReader::Read(int unit, const std::string& kind, int64_t lo, int64_t hi, float* dst) {
  const ManifestUnit& u = manifest_.units.at(unit);
  // Shard group 0 (world ranks [0, G)) holds one copy of every shard.
  while (lo < hi) {
    const int rank = static_cast<int>(lo / u.shard);
    const int64_t end = std::min(hi, (rank + 1) * u.shard);
    SL_ASSIGN_OR_RETURN(const SafetensorsReader* f, RankFile(rank));
    SL_RETURN_IF_ERROR(f->ReadFloats(absl::StrCat(u.unit, ".", kind), lo - rank * u.shard, end - lo, dst));
    dst += end - lo;
    lo = end;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointReader::StoredDType(int unit, const std::string& kind) {
  SL_ASSIGN_OR_RETURN(const SafetensorsReader* f, RankFile(0));
  const std::string name = absl::StrCat(manifest_.units.at(unit).unit, ".", kind);
  auto it = f->entries().find(name);
  if (it == f->entries().end()) return absl::DataLossError(absl::StrCat(f->path(), ": no tensor ", name));
  return it->second.dtype;
}

absl::Status CheckpointReader::ReadRankTensor(int rank, int unit, const std::string& name, const std::string& dtype,
                                              std::string* out) {
  SL_ASSIGN_OR_RETURN(const SafetensorsReader* f, RankFile(rank));
  return f->ReadRaw(absl::StrCat(manifest_.units.at(unit).unit, ".", name), dtype, out);
}

namespace {

// The checkpoint at step_dir, whose manifest lists what the model trains.
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenForExport(const std::string& step_dir) {
  SL_ASSIGN_OR_RETURN(auto ckpt, CheckpointReader::Open(step_dir));
  const CheckpointManifest& man = ckpt->manifest();
  const size_t trained = model::TrainableUnits(man.model, man.lora).size();
  if (man.units.size() != trained) {
    return absl::DataLossError(absl::StrCat(step_dir, ": manifest lists ", man.units.size(),
                                            " units, the model trains ", trained));
  }
  return ckpt;
}

// The full fp32 values of each model unit that a model export writes: the
// checkpoint's own or, for a LoRA checkpoint (--merge), the base's with the
// adapters merged in as PEFT's merge_and_unload does: W + (B A) * scaling.
class UnitValues {
 public:
  static absl::StatusOr<UnitValues> Open(CheckpointReader* ckpt, bool merge, const std::string& step_dir) {
    const CheckpointManifest& man = ckpt->manifest();
    UnitValues v(ckpt);
    if (!man.lora.enabled) {
      if (merge) return absl::InvalidArgumentError(absl::StrCat(step_dir, ": --merge: not a LoRA checkpoint"));
      return v;
    }
    if (!merge) {
      return absl::InvalidArgumentError(absl::StrCat(step_dir, ": a LoRA checkpoint holds adapters only: export "
                                                     "them with --format peft, or the merged model with --format hf "
                                                     "--merge"));
    }
    const ModelConfig base = LoraBaseModel(man);
    if (base.hf_dir.empty() && base.init_from.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          step_dir, ": --merge: the base is the engine's random initialisation (", man.base_weights,
          "), not a file to merge onto; export the adapters with --format peft"));
    }
    SL_ASSIGN_OR_RETURN(v.base_, WeightSource::Open(base));
    SL_RETURN_IF_ERROR(v.base_->Check());
    SL_RETURN_IF_ERROR(CheckBaseDigest(man, base, step_dir));
    const std::vector<int> trained = model::TrainableUnits(man.model, man.lora);
    for (size_t i = 0; i < trained.size(); ++i) v.adapter_index_[trained[i]] = static_cast<int>(i);
    return v;
  }

  absl::Status Read(int u, std::vector<float>* buf) {
    const CheckpointManifest& man = ckpt_->manifest();
    if (!base_) {
      buf->assign(man.units[u].numel, 0.0f);
      return ckpt_->Read(u, "param", 0, man.units[u].numel, buf->data());
    }
    SL_ASSIGN_OR_RETURN(ShardLayout layout,
                        MakeShardLayout(model::UnitName(man.model, u), model::UnitParams(man.model, u), 1));
    buf->assign(layout.padded_numel, 0.0f);
    SL_RETURN_IF_ERROR(ReadUnitRange(*base_, layout, 0, layout.padded_numel, buf->data()));
    auto it = adapter_index_.find(u);
    if (it == adapter_index_.end()) return absl::OkStatus();
    const int64_t n = man.units[it->second].numel;
    std::vector<float> ab(static_cast<size_t>(n));
    SL_RETURN_IF_ERROR(ckpt_->Read(it->second, "param", 0, n, ab.data()));
    const double scaling = man.lora.scaling();
    const int64_t r = man.lora.rank;
    int64_t off = 0;
    for (const model::LoraTarget& t : model::LoraTargets(man.model, man.lora, u)) {
      const float* a = ab.data() + off;               // [r, in]
      const float* b = a + r * t.in;                  // [out, r]
      off += r * (t.in + t.out);
      float* w = buf->data() + layout.params[t.base_index].offset;  // [out, in]
      std::vector<float> row(static_cast<size_t>(t.in));
      for (int64_t o = 0; o < t.out; ++o) {
        std::fill(row.begin(), row.end(), 0.0f);
        for (int64_t k = 0; k < r; ++k) {
          const float bk = b[o * r + k];
          for (int64_t i = 0; i < t.in; ++i) row[i] += bk * a[k * t.in + i];
        }
        for (int64_t i = 0; i < t.in; ++i) w[o * t.in + i] += static_cast<float>(row[i] * scaling);
      }
    }
    return absl::OkStatus();
  }

 private:
  explicit UnitValues(CheckpointReader* ckpt) : ckpt_(ckpt) {}
  CheckpointReader* ckpt_;
  std::unique_ptr<WeightSource> base_;  // LoRA: where the frozen base comes from
  std::map<int, int> adapter_index_;    // model unit -> trainable unit
};

// One output file of an HF export: a run of tensors in model order.
struct HfFile {
  std::string name;
  std::vector<SafetensorsStreamWriter::Decl> tensors;
  int64_t bytes = 0;
};

// Packs the model's tensors, in order, into files of at most `max_bytes`.
std::vector<HfFile> PlanHfFiles(const ModelConfig& m, int element_bytes, int64_t max_bytes) {
  std::vector<HfFile> files(1);
  for (int u = 0; u < model::NumUnits(m); ++u) {
    for (const ParamSpec& p : model::UnitParams(m, u)) {
      std::vector<int64_t> shape = p.shape;
      if (HfStoredTransposed(m, p.name)) std::swap(shape[0], shape[1]);
      const int64_t bytes = p.numel() * element_bytes;
      if (!files.back().tensors.empty() && files.back().bytes + bytes > max_bytes) files.emplace_back();
      files.back().tensors.push_back({p.name, shape});
      files.back().bytes += bytes;
    }
  }
  const size_t n = files.size();
  for (size_t i = 0; i < n; ++i) {
    files[i].name = n == 1 ? "model.safetensors"
                           : absl::StrFormat("model-%05d-of-%05d.safetensors", static_cast<int>(i + 1),
                                             static_cast<int>(n));
  }
  return files;
}

}  // namespace

namespace {

// A file that the loader of `kind`'s output would read from its folder:
// from_pretrained's weights in any of their formats, their indexes and the
// configs that decide what is loaded (an adapter_config.json makes
// transformers load an adapter over the base it names); PEFT's adapter
// files; DCP's .metadata and the .distcp files it lists.
bool ReadByLoader(ExportKind kind, absl::string_view name) {
  switch (kind) {
    case ExportKind::kHf:
      return absl::EndsWith(name, ".safetensors") || absl::EndsWith(name, ".safetensors.index.json") ||
             (absl::StartsWith(name, "pytorch_model") &&
              (absl::EndsWith(name, ".bin") || absl::EndsWith(name, ".bin.index.json"))) ||
             name == "tf_model.h5" || name == "flax_model.msgpack" || name == "config.json" ||
             name == "generation_config.json" || name == "adapter_config.json" || name == "adapter_model.bin";
    case ExportKind::kPeft:
      return absl::StartsWith(name, "adapter_model.") || name == "adapter_config.json";
    case ExportKind::kDcp:
      return name == ".metadata" || absl::EndsWith(name, ".distcp");
  }
  return false;
}

}  // namespace

bool WrittenByExport(ExportKind kind, absl::string_view name) {
  switch (kind) {
    case ExportKind::kHf: {
      for (const char* t : kTokenizerFiles) {
        if (name == t) return true;
      }
      int i = 0, n = 0;
      char tail = 0;
      const std::string s(name);
      const bool shard = name.size() == std::string("model-00001-of-00002.safetensors").size() &&
                         std::sscanf(s.c_str(), "model-%5d-of-%5d.safetensors%c", &i, &n, &tail) == 2;
      return shard || name == "model.safetensors" || name == "model.safetensors.index.json" ||
             name == "config.json";
    }
    case ExportKind::kPeft:
      return name == "adapter_model.safetensors" || name == "adapter_config.json";
    case ExportKind::kDcp:
      return name == ".metadata" || name == "__0_0.distcp";
  }
  return false;
}

// Weights left by an earlier export would be loaded in place of these (one
// model.safetensors beside a new sharded index is read by from_pretrained
// first): hence an empty folder, or --overwrite of this export's own files.
absl::Status PrepareExportDir(const std::string& out_dir, bool overwrite, ExportKind kind) {
  SL_RETURN_IF_ERROR(MakeDirs(out_dir));
  SL_ASSIGN_OR_RETURN(UniqueFd dir, OpenDirectoryNoFollow(AT_FDCWD, out_dir, out_dir));
  DIR* listing = ::fdopendir(::dup(dir.get()));
  if (!listing) return absl::InternalError(absl::StrCat(out_dir, ": cannot list: ", std::strerror(errno)));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(listing)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(listing);
  if (names.empty()) return absl::OkStatus();
  std::sort(names.begin(), names.end());
  if (!overwrite) {
    return absl::FailedPreconditionError(absl::StrCat(
        out_dir, ": not empty (", Quoted(names[0]), names.size() > 1 ? absl::StrCat(" and ", names.size() - 1, " more") : "",
        "): an export goes to a new or empty folder, or --overwrite replaces an earlier export's files there"));
  }
  // Every refusal before the first removal.
  std::vector<std::string> ours;
  for (const std::string& name : names) {
    const std::string shown = absl::StrCat(out_dir, "/", Shown(name));
    if (WrittenByExport(kind, name)) {
      struct stat st;
      if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
        return absl::FailedPreconditionError(
            absl::StrCat(shown, ": not a regular file, where this export writes one: --overwrite removes only files"));
      }
      ours.push_back(name);
    } else if (ReadByLoader(kind, name)) {
      return absl::FailedPreconditionError(absl::StrCat(
          shown, ": not a file this export writes, and a loader would read it beside the export: "
                 "--overwrite removes only the export's own files; move it, or export to another folder"));
    }
  }
  for (const std::string& name : ours) {
    if (::unlinkat(dir.get(), name.c_str(), 0) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(out_dir, "/", Shown(name), ": cannot remove the earlier export's file: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

namespace {

// The folder the job's model came from, where the manifest records one.
std::string SourceModelDir(const CheckpointManifest& m) {
  if (!m.model.hf_dir.empty()) return m.model.hf_dir;
  return m.lora.enabled ? LoraBaseModel(m).hf_dir : "";
}

// Copies whichever kTokenizerFiles `from` holds into `out_dir`.
absl::StatusOr<HfExportReport> CopyTokenizer(const std::string& from, bool given, const std::string& out_dir) {
  HfExportReport report;
  struct stat st;
  if (from.empty() || ::stat(from.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    if (given) return absl::NotFoundError(absl::StrCat("--tokenizer ", Shown(from, 256), ": no such directory"));
    report.no_tokenizer = from.empty() ? "the job did not start from a model directory"
                                       : absl::StrCat("its model directory ", Shown(from, 256), " is gone");
    return report;
  }
  for (const char* name : kTokenizerFiles) {
    const std::string path = from + "/" + name;
    if (::stat(path.c_str(), &st) != 0) continue;
    SL_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, "tokenizer file"));
    SL_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/" + name, text));
    report.copied.push_back(name);
  }
  if (report.copied.empty()) {
    if (given) return absl::NotFoundError(absl::StrCat("--tokenizer ", Shown(from, 256), ": no tokenizer files there"));
    report.no_tokenizer = absl::StrCat("its model directory ", Shown(from, 256), " holds no tokenizer files");
  } else {
    report.tokenizer_from = from;
  }
  return report;
}

}  // namespace

absl::StatusOr<HfExportReport> ExportHf(const std::string& step_dir, const std::string& out_dir,
                                        const HfExportOptions& options) {
  SL_ASSIGN_OR_RETURN(auto ckpt, OpenForExport(step_dir));
  const ModelConfig& m = ckpt->manifest().model;
  SL_ASSIGN_OR_RETURN(UnitValues values, UnitValues::Open(ckpt.get(), options.merge, step_dir));
  SL_RETURN_IF_ERROR(PrepareExportDir(out_dir, options.overwrite, ExportKind::kHf));
  const int element_bytes = options.dtype == StoredDType::kF32 ? 4 : 2;
  const std::vector<HfFile> files = PlanHfFiles(m, element_bytes, std::max<int64_t>(options.max_shard_bytes, 1));
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  size_t file = 0, tensor = 0;  // the next tensor to write
  std::unique_ptr<SafetensorsStreamWriter> out;
  std::vector<float> buf, transposed;
  for (int u = 0; u < model::NumUnits(m); ++u) {
    SL_RETURN_IF_ERROR(values.Read(u, &buf));  // one unit at a time
    int64_t offset = 0;
    for (const ParamSpec& p : model::UnitParams(m, u)) {
      if (!out) {
        SL_ASSIGN_OR_RETURN(out, SafetensorsStreamWriter::Create(out_dir + "/" + files[file].name,
                                                                 files[file].tensors, options.dtype));
      }
      const float* data = buf.data() + offset;
      if (HfStoredTransposed(m, p.name)) {  // [out, in] -> Conv1D's [in, out]
        const int64_t rows = p.shape[0], cols = p.shape[1];
        transposed.resize(static_cast<size_t>(rows * cols));
        for (int64_t o = 0; o < rows; ++o) {
          for (int64_t i = 0; i < cols; ++i) transposed[i * rows + o] = data[o * cols + i];
        }
        data = transposed.data();
      }
      SL_RETURN_IF_ERROR(out->Append(data, p.numel()));
      weight_map[p.name] = files[file].name;
      total += p.numel() * element_bytes;
      offset += p.numel();
      if (++tensor == files[file].tensors.size()) {
        SL_RETURN_IF_ERROR(out->Finish());
        out.reset();
        ++file;
        tensor = 0;
      }
    }
  }
  if (files.size() > 1) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    SL_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  }
  const bool given = !options.tokenizer_dir.empty();
  SL_ASSIGN_OR_RETURN(HfExportReport report,
                      CopyTokenizer(given ? options.tokenizer_dir : SourceModelDir(ckpt->manifest()), given, out_dir));
  // config.json last: a directory with it is complete.
  SL_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/config.json",
                                         HfConfigJson(m, options.dtype == StoredDType::kF32 ? "float32" : "bfloat16")));
  return report;
}

absl::Status ExportModel(const std::string& step_dir, const std::string& out_path) {
  SL_ASSIGN_OR_RETURN(auto ckpt, OpenForExport(step_dir));
  const ModelConfig& m = ckpt->manifest().model;
  SL_RETURN_IF_ERROR(UnitValues::Open(ckpt.get(), /*merge=*/false, step_dir).status());
  const int units = model::NumUnits(m);
  std::vector<SafetensorsStreamWriter::Decl> decls;
  for (int u = 0; u < units; ++u) {
    for (const ParamSpec& p : model::UnitParams(m, u)) decls.push_back({p.name, p.shape});
  }
  // A head tied to the token embedding is written under both names, as the
  // models' state_dicts have them (an untied head has its own lm_head).
  const std::vector<int64_t> wte_shape = {m.vocab_size, m.n_embd};
  if (m.tied()) decls.push_back({"lm_head.weight", wte_shape});
  SL_ASSIGN_OR_RETURN(auto out, SafetensorsStreamWriter::Create(out_path, decls));
  std::vector<float> buf;
  for (int u = 0; u < units; ++u) {
    const int64_t numel = ckpt->manifest().units[u].numel;
    buf.assign(numel, 0.0f);  // one unit at a time
    SL_RETURN_IF_ERROR(ckpt->Read(u, "param", 0, numel, buf.data()));
    SL_RETURN_IF_ERROR(out->Append(buf.data(), numel));
  }
  if (m.tied()) {
    buf.assign(wte_shape[0] * wte_shape[1], 0.0f);  // the embedding leads the embed unit
    SL_RETURN_IF_ERROR(ckpt->Read(0, "param", 0, static_cast<int64_t>(buf.size()), buf.data()));
    SL_RETURN_IF_ERROR(out->Append(buf.data(), static_cast<int64_t>(buf.size())));
  }
  return out->Finish();
}

absl::Status ExportPeft(const std::string& step_dir, const std::string& out_dir, StoredDType dtype, bool overwrite) {
  SL_ASSIGN_OR_RETURN(auto ckpt, OpenForExport(step_dir));
  const CheckpointManifest& man = ckpt->manifest();
  if (!man.lora.enabled) {
    return absl::InvalidArgumentError(absl::StrCat(step_dir, ": --format peft: not a LoRA checkpoint (no adapters)"));
  }
  SL_RETURN_IF_ERROR(PrepareExportDir(out_dir, overwrite, ExportKind::kPeft));
  const std::vector<int> trained = model::TrainableUnits(man.model, man.lora);
  std::vector<SafetensorsStreamWriter::Decl> decls;
  for (int u : trained) {
    for (const ParamSpec& p : model::AdapterParams(man.model, man.lora, u)) decls.push_back({PeftTensorName(p.name), p.shape});
  }
  SL_ASSIGN_OR_RETURN(auto out, SafetensorsStreamWriter::Create(out_dir + "/adapter_model.safetensors", decls, dtype));
  std::vector<float> buf;
  for (size_t i = 0; i < trained.size(); ++i) {
    const int64_t numel = man.units[i].numel;
    buf.assign(numel, 0.0f);  // one unit's adapters at a time
    SL_RETURN_IF_ERROR(ckpt->Read(static_cast<int>(i), "param", 0, numel, buf.data()));
    SL_RETURN_IF_ERROR(out->Append(buf.data(), numel));
  }
  SL_RETURN_IF_ERROR(out->Finish());
  // adapter_config.json last: a directory with it is complete.
  return WriteFileAtomically(out_dir + "/adapter_config.json",
                             PeftAdapterConfigJson(man.model, man.lora, LoraBaseModel(man).hf_dir));
}

}  // namespace shardline
