#include "worker/checkpoint/checkpoint.h"

#include "common/base/fault_injection.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>


#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_export.h"
#include "worker/checkpoint/tensor_file.h"

namespace shardline {
namespace {

constexpr const char* kKinds[] = {"param", "exp_avg", "exp_avg_sq"};

// The moments' codes that the old rank whose shard was exactly this rank's
// range saved beside their values (Engine::ShardState::encoded), so that a
// resume over the same shards continues bitwise; empty where no old shard
// is this range or the state keeps none (then the values are requantized).
absl::StatusOr<AdamWState::Encoded> ReadEncoded(CheckpointReader& ckpt, const Engine& engine, int u, int64_t begin) {
  const AdamWState::Encoded live = engine.ShardEncoding(u);
  const ManifestUnit& old = ckpt.manifest().units[u];
  const int64_t numel = engine.ShardLength(u);
  if (live.empty() || old.shard != numel || begin % old.shard != 0 || begin >= old.numel) return AdamWState::Encoded();
  const int rank = static_cast<int>(begin / old.shard);
  if (rank >= ckpt.manifest().shard_group_size) return AdamWState::Encoded();
  AdamWState::Encoded out;
  for (const auto& [name, t] : live) {
    const bool codes = t.scalar_type() == at::kByte;
    std::string bytes;
    absl::Status s = ckpt.ReadRankTensor(rank, u, name, codes ? "U8" : "F32", &bytes);
    if (absl::IsNotFound(s)) return AdamWState::Encoded();  // (saved with dense moments)
    SL_RETURN_IF_ERROR(s);
    if (static_cast<int64_t>(bytes.size()) != t.nbytes()) return AdamWState::Encoded();  // (another layout)
    at::Tensor v = at::empty({t.numel()}, t.options().device(at::kCPU));
    std::memcpy(v.data_ptr(), bytes.data(), bytes.size());
    out.emplace_back(name, std::move(v));
  }
  return out;
}


}  // namespace

int64_t ShardSnapshot::bytes() const {
  int64_t n = 0;
  for (const auto& s : shards) {
    n += s.master.nbytes() + s.exp_avg.nbytes() + s.exp_avg_sq.nbytes();
    for (const auto& [name, t] : s.encoded) n += t.nbytes();
  }
  return n;
}

absl::StatusOr<ShardSnapshot> SnapshotShards(Engine& engine, bool copy) {
  ShardSnapshot snap;
  snap.rank = engine.rank();
  snap.shard_rank = engine.shard_rank();
  for (int u = 0; u < static_cast<int>(engine.trainable_layouts().size()); ++u) {
    SL_ASSIGN_OR_RETURN(Engine::ShardState s, engine.WholeShard(u));
    // Files are written from host memory: a device's shards are always
    // copied (synchronously, on the caller's stream); a host's only if asked.
    auto host = [copy](const at::Tensor& t) { return t.is_cpu() ? (copy ? t.clone() : t) : t.to(at::kCPU); };
    AdamWState::Encoded encoded;
    for (auto& [name, t] : s.encoded) encoded.emplace_back(name, host(t));
    s = {host(s.master), host(s.exp_avg), host(s.exp_avg_sq), std::move(encoded)};
    snap.units.push_back(engine.trainable_layouts()[u].unit);
    snap.shards.push_back(std::move(s));
  }
  return snap;
}

absl::StatusOr<ManifestRankFile> WriteRankShards(const ShardSnapshot& snap, const std::string& step_dir, int64_t step,
                                                 int attempt) {
  InjectProcessFault("shardline", "before-write", step);
  InjectProcessFault("shardline", "stop-before-write", step);
  // Neither the job's checkpoint root nor the step directory may be a
  // symlink: one planted there (to another job's step, say) is refused, not
  // written through, as the coordinator refuses it for its manifest.
  const auto slash = step_dir.rfind('/');
  const std::string root = slash == std::string::npos ? "." : step_dir.substr(0, slash);
  const std::string step_name = step_dir.substr(slash + 1);
  SL_RETURN_IF_ERROR(MakeDirs(root));
  SL_ASSIGN_OR_RETURN(UniqueFd root_fd, OpenDirectoryNoFollow(AT_FDCWD, root, root));
  if (::mkdirat(root_fd.get(), step_name.c_str(), 0750) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat(step_dir, ": cannot create: ", std::strerror(errno)));
  }
  SL_ASSIGN_OR_RETURN(UniqueFd step_fd, OpenDirectoryNoFollow(root_fd.get(), step_name, step_dir));
  NamedTensors tensors;
  for (size_t u = 0; u < snap.units.size(); ++u) {
    tensors.emplace_back(snap.units[u] + ".param", snap.shards[u].master);
    tensors.emplace_back(snap.units[u] + ".exp_avg", snap.shards[u].exp_avg);
    tensors.emplace_back(snap.units[u] + ".exp_avg_sq", snap.shards[u].exp_avg_sq);
    for (const auto& [name, t] : snap.shards[u].encoded) tensors.emplace_back(snap.units[u] + "." + name, t);
  }
  ManifestRankFile f;
  f.rank = snap.rank;
  f.file = RankFileName(snap.rank, attempt);
  const std::string path = step_dir + "/" + f.file;
  SL_RETURN_IF_ERROR(WriteSafetensorsAt(step_fd.get(), step_dir, f.file, tensors,
                                        {{"rank", std::to_string(snap.rank)},
                                         {"shard_rank", std::to_string(snap.shard_rank)},
                                         {"step", std::to_string(step)}},
                                        [&](size_t written) {
                                          if (written == tensors.size() / 2) {
                                            InjectProcessFault("shardline", "mid-write", step);
                                            InjectProcessFault("shardline", "stop-mid-write", step);
                                          }
                                        }));
  SL_RETURN_IF_ERROR(DescribeWrittenRankFile(path, &f));
  InjectProcessFault("shardline", "before-report", step);
  return f;
}

absl::StatusOr<ManifestRankFile> SaveRankShards(Engine& engine, const std::string& step_dir, int64_t step) {
  SL_ASSIGN_OR_RETURN(const ShardSnapshot snap, SnapshotShards(engine, /*copy=*/false));
  return WriteRankShards(snap, step_dir, step);
}

absl::StatusOr<CheckpointManifest> ManifestFor(const Engine& engine, const JobConfig& c, int64_t step) {
  return NewManifest(c.name, c, engine.world(), step);
}

absl::StatusOr<CheckpointManifest> LoadCheckpoint(Engine& engine, const JobConfig& c, const std::string& dir) {
  SL_ASSIGN_OR_RETURN(auto ckpt, CheckpointReader::Open(dir));
  const CheckpointManifest& m = ckpt->manifest();
  SL_RETURN_IF_ERROR(CheckSameTraining(m, c, dir));
  if (m.units.size() != engine.trainable_layouts().size()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": manifest lists ", m.units.size(), " units, the model has ",
                                                   engine.trainable_layouts().size()));
  }
  for (int u = 0; u < static_cast<int>(engine.trainable_layouts().size()); ++u) {
    const ShardLayout& now = engine.trainable_layouts()[u];
    if (m.units[u].unit != now.unit || m.units[u].numel != now.numel) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": unit ", u, " is ", m.units[u].unit, " with ",
                                                     m.units[u].numel, " elements there, ", now.unit, " with ",
                                                     now.numel, " here"));
    }
    // This rank's new shard, read from whichever old shards overlap it, on
    // the host as fp32; then set in one piece (rounded to nearest even into
    // bf16 state, as Optimizer.load_state_dict casts state; quantized into
    // 8-bit moments).
    const int64_t numel = engine.ShardLength(u);
    const int64_t begin = engine.ShardStateOffset(u);
    const int64_t end = std::min(begin + engine.ShardStateNumel(u), now.numel);  // padding stays zero
    Engine::ShardState values{at::zeros({numel}, at::kFloat), at::zeros({numel}, at::kFloat),
                              at::zeros({numel}, at::kFloat)};
    at::Tensor* read[] = {&values.master, &values.exp_avg, &values.exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      if (end > begin) SL_RETURN_IF_ERROR(ckpt->Read(u, kKinds[k], begin, end, read[k]->data_ptr<float>()));
    }
    SL_ASSIGN_OR_RETURN(values.encoded, ReadEncoded(*ckpt, engine, u, begin));
    SL_RETURN_IF_ERROR(engine.LoadShardState(u, values));
  }
  SL_RETURN_IF_ERROR(engine.PublishLoadedState());
  return m;
}

}  // namespace shardline
