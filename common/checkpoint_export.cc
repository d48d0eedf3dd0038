#include "common/checkpoint_export.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_shapes.h"
#include "common/status_macros.h"

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
  SL_ASSIGN_OR_RETURN(std::string sha, Sha256OfFile(path));
  if (sha != entry->sha256) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (sha256 ", sha.substr(0, 12),
                                            "..., manifest says ", entry->sha256.substr(0, 12), "...)"));
  }
  SL_ASSIGN_OR_RETURN(auto f, SafetensorsReader::Open(path));
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

absl::Status ExportModel(const std::string& step_dir, const std::string& out_path) {
  SL_ASSIGN_OR_RETURN(auto ckpt, CheckpointReader::Open(step_dir));
  const ModelConfig& m = ckpt->manifest().model;
  const int units = model::NumUnits(m);
  if (static_cast<int>(ckpt->manifest().units.size()) != units) {
    return absl::DataLossError(absl::StrCat(step_dir, ": manifest lists ", ckpt->manifest().units.size(),
                                            " units, the model has ", units));
  }
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

}  // namespace shardline
