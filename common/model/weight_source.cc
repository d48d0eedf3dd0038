#include "common/model/weight_source.h"

#include <algorithm>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/model/hf_config.h"
#include "common/model/lora_adapter.h"
#include "common/model/model_shapes.h"

namespace shardline {

namespace {

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string ShapeText(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

// GPT-2's position table, which the engine holds for block_size rows only.
bool IsPositionTable(const ModelConfig& m, const std::string& name) {
  return !m.is_llama() && name == "transformer.wpe.weight";
}

// The shard files an index names: plain file names inside the directory.
absl::StatusOr<std::map<std::string, std::string>> ReadIndex(const std::string& path) {
  SL_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, "safetensors index"));
  std::map<std::string, std::string> weight_map;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    for (const auto& [name, file] : j.at("weight_map").items()) weight_map[name] = file.get<std::string>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed index: ", Shown(e.what(), 256)));
  }
  for (const auto& [name, file] : weight_map) {
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", Shown(name), " maps to ", Quoted(file), ", not a file name in this directory"));
    }
  }
  return weight_map;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WeightSource>> WeightSource::Open(const ModelConfig& m) {
  if (!m.init_from.empty()) {
    std::unique_ptr<WeightSource> w(new WeightSource(m, "[model] init_from", m.init_from));
    SL_RETURN_IF_ERROR(w->AddFile(m.init_from));
    return w;
  }
  if (m.hf_dir.empty()) return nullptr;
  std::unique_ptr<WeightSource> w(new WeightSource(m, "[model] hf_dir", m.hf_dir));
  const std::string index = m.hf_dir + "/model.safetensors.index.json";
  if (IsFile(index)) {
    SL_ASSIGN_OR_RETURN(auto weight_map, ReadIndex(index));
    std::map<std::string, const SafetensorsReader*> opened;
    for (const auto& [name, file] : weight_map) {
      if (!opened.count(file)) {
        SL_RETURN_IF_ERROR(w->AddFile(m.hf_dir + "/" + file));
        opened[file] = w->files_.back().get();
      }
      const SafetensorsReader* f = opened[file];
      if (!f->entries().count(name)) {
        return absl::DataLossError(absl::StrCat(index, ": maps tensor ", Shown(name), " to ", Shown(file), ", which has no such tensor"));
      }
      w->tensors_[name] = f;
    }
    return w;
  }
  if (IsFile(m.hf_dir + "/model.safetensors")) {
    SL_RETURN_IF_ERROR(w->AddFile(m.hf_dir + "/model.safetensors"));
    return w;
  }
  return absl::NotFoundError(absl::StrCat("[model] hf_dir ", m.hf_dir,
                                          " has neither model.safetensors nor model.safetensors.index.json"));
}

absl::StatusOr<std::unique_ptr<WeightSource>> WeightSource::OpenAdapters(const ModelConfig& m, const LoraConfig& l) {
  if (!l.enabled || l.init_from.empty()) return nullptr;
  std::unique_ptr<WeightSource> w(new WeightSource(m, "[lora] init_from", l.init_from));
  w->lora_ = l;
  SL_RETURN_IF_ERROR(w->AddFile(l.init_from + "/adapter_model.safetensors"));
  return w;
}

absl::StatusOr<std::string> WeightSource::Digest() const {
  std::string all;
  for (const auto& f : files_) {
    SL_ASSIGN_OR_RETURN(std::string print, f->Fingerprint());
    const std::string& path = f->path();
    absl::StrAppend(&all, path.substr(path.rfind('/') + 1), " ", print, "\n");
  }
  return Sha256Hex(all);
}

absl::StatusOr<std::string> BaseWeightsDigest(const ModelConfig& m) {
  SL_ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> w, WeightSource::Open(m));
  if (!w) return std::string();
  return w->Digest();
}

absl::Status WeightSource::AddFile(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> f = SafetensorsReader::Open(path);
  if (!f.ok()) return absl::Status(f.status().code(), absl::StrCat(key_, ": ", f.status().message()));
  for (const auto& [name, e] : (*f)->entries()) tensors_.emplace(name, f->get());
  files_.push_back(*std::move(f));
  return absl::OkStatus();
}

absl::StatusOr<WeightSource::Located> WeightSource::Locate(const ParamSpec& p) const {
  if (lora_.enabled) {
    const std::string name = PeftTensorName(p.name);
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat(key_, " ", path_, ": no tensor ", name));
    return Located{it->second, name, false};
  }
  std::vector<std::string> names = {p.name};
  if (m_.tied() && p.name == model::UnitParams(m_, 0)[0].name) names.push_back("lm_head.weight");
  const std::string prefix = "transformer.";
  if (!m_.is_llama() && p.name.rfind(prefix, 0) == 0) names.push_back(p.name.substr(prefix.size()));
  for (const std::string& name : names) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) continue;
    return Located{it->second, name, !m_.hf_dir.empty() && m_.init_from.empty() && HfStoredTransposed(m_, p.name)};
  }
  return absl::NotFoundError(absl::StrCat(key_, " ", path_, ": no tensor ", p.name));
}

absl::Status WeightSource::CheckShape(const ParamSpec& p, const Located& at) const {
  const SafetensorsReader::Entry& e = at.file->entries().at(at.name);
  if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16") {
    return absl::InvalidArgumentError(
        absl::StrCat(at.file->path(), ": tensor ", Shown(at.name), " is ", Shown(e.dtype, 16), " (expected F32, BF16 or F16)"));
  }
  std::vector<int64_t> want = p.shape;
  if (at.transposed) std::swap(want[0], want[1]);
  bool ok = e.shape == want;
  // A longer position table is fine: the engine reads its first rows.
  if (!ok && IsPositionTable(m_, p.name) && e.shape.size() == 2) ok = e.shape[1] == want[1] && e.shape[0] >= want[0];
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(at.file->path(), ": tensor ", at.name, " has shape ",
                                                 ShapeText(e.shape), ", the model needs ", ShapeText(want)));
}

absl::Status WeightSource::Check() const {
  for (int u = 0; u < model::NumUnits(m_); ++u) {
    for (const ParamSpec& p : lora_.enabled ? model::AdapterParams(m_, lora_, u) : model::UnitParams(m_, u)) {
      SL_ASSIGN_OR_RETURN(Located at, Locate(p));
      SL_RETURN_IF_ERROR(CheckShape(p, at));
    }
  }
  return absl::OkStatus();
}

absl::Status WeightSource::Read(const ParamSpec& p, int64_t first, int64_t count, float* dst) const {
  SL_ASSIGN_OR_RETURN(Located at, Locate(p));
  SL_RETURN_IF_ERROR(CheckShape(p, at));
  if (first < 0 || count < 0 || first + count > p.numel()) {
    return absl::OutOfRangeError(absl::StrCat(p.name, " has no elements [", first, ", ", first + count, ")"));
  }
  // Row-major with the same row length: the engine's first rows are the
  // file's first rows (a longer position table included).
  if (!at.transposed) return at.file->ReadFloats(at.name, first, count, dst);
  const int64_t out = p.shape[0], in = p.shape[1];
  std::vector<float> stored(static_cast<size_t>(out * in));  // [in, out]
  SL_RETURN_IF_ERROR(at.file->ReadFloats(at.name, 0, out * in, stored.data()));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t o = (first + k) / in, i = (first + k) % in;
    dst[k] = stored[i * out + o];
  }
  return absl::OkStatus();
}

absl::Status ReadUnitRange(const WeightSource& w, const ShardLayout& layout, int64_t begin, int64_t count,
                           float* dst) {
  std::fill(dst, dst + count, 0.0f);
  const int64_t end = begin + count;
  for (const ParamSlot& s : layout.params) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.spec.numel());
    if (lo < hi) SL_RETURN_IF_ERROR(w.Read(s.spec, lo - s.offset, hi - lo, dst + (lo - begin)));
  }
  return absl::OkStatus();
}

}  // namespace shardline
