#include "common/checkpoint/checkpoint_manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/model/hf_config.h"
#include "common/model/model_shapes.h"
#include "common/model/weight_source.h"
#include "common/spec/job_spec.h"

namespace shardline {

using nlohmann::json;

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

std::string LoraBaseWeights(const JobConfig& c) {
  if (!c.model.hf_dir.empty()) return "hf_dir " + c.model.hf_dir;
  if (!c.model.init_from.empty()) return "init_from " + c.model.init_from;
  return absl::StrCat("seed ", c.train.seed);
}

ModelConfig LoraBaseModel(const CheckpointManifest& m) {
  ModelConfig base = m.model;
  const std::string& from = m.base_weights;
  for (auto [prefix, field] : {std::pair<std::string, std::string*>{"hf_dir ", &base.hf_dir},
                               {"init_from ", &base.init_from}}) {
    if (from.rfind(prefix, 0) == 0) *field = from.substr(prefix.size());
  }
  return base;
}

absl::Status DescribeWrittenRankFile(const std::string& path, ManifestRankFile* f) {
  SL_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFileNoFollow(path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": cannot stat after writing: ", std::strerror(errno)));
  }
  f->size = st.st_size;
  SL_ASSIGN_OR_RETURN(f->sha256, Sha256OfOpenFile(fd.get(), path));
  return absl::OkStatus();
}

absl::StatusOr<CheckpointManifest> NewManifest(const std::string& job, const JobConfig& c, int world_size,
                                               int64_t step) {
  absl::StatusOr<std::vector<ShardLayout>> ownership =
      model::TrainableOwnershipMap(c.model, c.lora, ShardGroupSize(c, world_size));
  if (!ownership.ok()) return ownership.status();
  CheckpointManifest m;
  m.job = job;
  m.step = step;
  m.total_steps = c.train.steps;
  m.data_step = step;  // data order is a function of the global step alone
  m.seed = c.train.seed;
  m.model = c.model;
  m.strategy = StrategyName(c.parallelism.strategy);
  m.world_size = world_size;
  m.shard_group_size = ShardGroupSize(c, world_size);
  for (const ShardLayout& l : *ownership) m.units.push_back({l.unit, l.numel, l.padded_numel, l.shard_numel, l.group_size});
  if (c.lora.enabled) {
    m.lora = c.lora;
    m.lora.target_modules = model::LoraModules(c.model, c.lora);
    m.base_weights = LoraBaseWeights(c);
  }
  return m;
}

std::string RankFileName(int rank, int attempt) {
  if (attempt <= 1) return absl::StrFormat("rank-%05d.safetensors", rank);
  return absl::StrFormat("rank-%05d.a%04d.safetensors", rank, attempt);
}

std::string RankFilePath(const std::string& checkpoint_root, int64_t step, int rank, int attempt) {
  return absl::StrCat(checkpoint_root, "/", StepDirName(step), "/", RankFileName(rank, attempt));
}

namespace {

std::string ManifestText(const CheckpointManifest& m) {
  json j;
  j["format_version"] = m.format_version;
  j["job"] = m.job;
  j["step"] = m.step;
  j["total_steps"] = m.total_steps;
  j["data_step"] = m.data_step;
  j["seed"] = m.seed;
  j["model"] = {{"family", m.model.family},         {"n_layer", m.model.n_layer},
                {"n_head", m.model.n_head},         {"n_embd", m.model.n_embd},
                {"vocab_size", m.model.vocab_size}, {"block_size", m.model.block_size}};
  if (m.model.is_llama()) {
    const ModelConfig& l = m.model;
    j["model"].update({{"n_kv_head", l.kv_heads()},
                       {"intermediate_size", l.intermediate_size},
                       {"head_dim", l.head_dim()},
                       {"rope_theta", l.rope_theta},
                       {"rms_norm_eps", l.rms_norm_eps},
                       {"qkv_bias", l.qkv_bias},
                       {"qk_norm", l.qk_norm},
                       {"tie_word_embeddings", l.tie_word_embeddings},
                       {"rope_scaling", l.rope_scaling},
                       {"rope_scaling_factor", l.rope_scaling_factor},
                       {"rope_low_freq_factor", l.rope_low_freq_factor},
                       {"rope_high_freq_factor", l.rope_high_freq_factor},
                       {"rope_original_max_position", l.rope_original_max_position}});
    if (l.max_position_embeddings > 0) j["model"]["max_position_embeddings"] = l.max_position_embeddings;
  }
  // Where the model came from, for an HF export's tokenizer and token ids.
  if (!m.model.hf_dir.empty()) j["model"]["hf_dir"] = m.model.hf_dir;
  if (!m.model.special_token_ids.empty()) j["model"]["special_token_ids"] = json::parse(m.model.special_token_ids);
  if (m.lora.enabled) {
    j["lora"] = {{"rank", m.lora.rank}, {"alpha", m.lora.alpha}, {"target_modules", m.lora.target_modules},
                 {"base", LoraBaseName(m.lora.base)}, {"base_weights", m.base_weights},
                 {"base_dtype", LoraBaseDTypeName(m.lora.base_dtype)}};
    if (!m.lora.base_digest.empty()) j["lora"]["base_digest"] = m.lora.base_digest;
  }
  j["strategy"] = m.strategy;
  j["world_size"] = m.world_size;
  j["shard_group_size"] = m.shard_group_size;
  j["ownership"] = json::array();
  for (const auto& u : m.units) {
    j["ownership"].push_back({{"unit", u.unit}, {"numel", u.numel}, {"padded", u.padded}, {"shard", u.shard},
                              {"group_size", u.group_size}});
  }
  j["ranks"] = json::array();
  for (const auto& r : m.ranks) {
    j["ranks"].push_back({{"rank", r.rank}, {"file", r.file}, {"size", r.size}, {"sha256", r.sha256}});
  }
  return j.dump(2) + "\n";
}

}  // namespace

absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& m) {
  return WriteFileAtomically(dir + "/manifest.json", ManifestText(m));
}

absl::Status WriteManifestConfined(const std::string& checkpoint_root, const CheckpointManifest& m) {
  const std::string name = StepDirName(m.step);
  const std::string dir = absl::StrCat(checkpoint_root, "/", name);
  absl::StatusOr<UniqueFd> root_fd = OpenDirectoryNoFollow(AT_FDCWD, checkpoint_root, checkpoint_root);
  if (!root_fd.ok()) return root_fd.status();
  absl::StatusOr<UniqueFd> dir_fd = OpenDirectoryNoFollow(root_fd->get(), name, dir);
  if (!dir_fd.ok()) return dir_fd.status();
  // The same confinement by real paths, as the contract states it, so that
  // it does not rest on O_NOFOLLOW alone.
  char real_root[PATH_MAX], real_dir[PATH_MAX];
  if (::realpath(checkpoint_root.c_str(), real_root) == nullptr) {
    return absl::NotFoundError(absl::StrCat(checkpoint_root, ": cannot resolve: ", std::strerror(errno)));
  }
  if (::realpath(dir.c_str(), real_dir) == nullptr) {
    return absl::NotFoundError(absl::StrCat(dir, ": cannot resolve: ", std::strerror(errno)));
  }
  const std::string want = absl::StrCat(real_root, "/", name);
  if (want != real_dir) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": resolves to ", real_dir, ", not the job's own step directory ", want));
  }
  return WriteFileAtomicallyAt(dir_fd->get(), dir, "manifest.json", ManifestText(m));
}

namespace {

// An integer field within [lo, hi], checked before it is narrowed.
int64_t IntIn(const json& o, const char* key, int64_t lo, int64_t hi) {
  const json& v = o.at(key);
  if (!v.is_number_integer()) throw std::runtime_error(absl::StrCat(key, " must be an integer"));
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                        ? INT64_MAX
                        : v.get<int64_t>();
  if (x < lo || x > hi) throw std::runtime_error(absl::StrCat(key, " = ", x, " is out of range [", lo, ", ", hi, "]"));
  return x;
}

// What a reader relies on: a model the engine accepts, an ownership map that
// is that model's at the recorded group size, and one plain file name per
// rank of shard group 0 (names that leave the directory are refused).
absl::Status CheckManifest(const CheckpointManifest& m, const std::string& path) {
  auto bad = [&](const std::string& what) { return absl::DataLossError(absl::StrCat(path, ": ", what)); };
  JobConfig c;
  c.model = m.model;
  c.train.batch_size = m.world_size;
  c.train.micro_batch_size = 1;
  absl::Status valid = ValidateJobConfig(c, m.world_size, path);
  if (!valid.ok()) return bad(absl::StrCat("model: ", valid.message()));
  if (m.world_size % m.shard_group_size != 0) {
    return bad(absl::StrCat("shard_group_size ", m.shard_group_size, " does not divide world_size ", m.world_size));
  }
  if (m.step > m.total_steps) return bad(absl::StrCat("step ", m.step, " is past total_steps ", m.total_steps));
  if (m.lora.enabled) {
    c.lora = m.lora;
    valid = ValidateJobConfig(c, m.world_size, path);
    if (!valid.ok()) return bad(absl::StrCat("lora: ", valid.message()));
  }
  const absl::StatusOr<std::vector<ShardLayout>> own =
      model::TrainableOwnershipMap(m.model, m.lora, m.shard_group_size);
  if (!own.ok()) return bad(std::string(own.status().message()));
  if (m.units.size() != own->size()) {
    return bad(absl::StrCat("ownership lists ", m.units.size(), " units, the model trains ", own->size()));
  }
  for (size_t u = 0; u < m.units.size(); ++u) {
    const ManifestUnit& x = m.units[u];
    const ShardLayout& l = (*own)[u];
    if (x.unit != l.unit || x.numel != l.numel || x.group_size != l.group_size || x.padded != l.padded_numel ||
        x.shard != l.shard_numel) {
      return bad(absl::StrCat("ownership of unit ", u, " (", Shown(x.unit), ": numel ", x.numel, ", padded ", x.padded,
                              ", shard ", x.shard, ", group_size ", x.group_size, ") is not the model's (", l.unit,
                              ": numel ", l.numel, " at group size ", l.group_size, ")"));
    }
  }
  std::vector<bool> seen(m.world_size, false);
  for (const ManifestRankFile& r : m.ranks) {
    if (r.rank < 0 || r.rank >= m.world_size || seen[r.rank]) {
      return bad(absl::StrCat("rank ", r.rank, " is out of range or listed twice"));
    }
    seen[r.rank] = true;
    if (r.file.empty() || r.file == "." || r.file == ".." || r.file.find('/') != std::string::npos) {
      return bad(absl::StrCat("rank ", r.rank, "'s file ", Quoted(r.file), " is not a file name in the checkpoint"));
    }
  }
  for (int r = 0; r < m.shard_group_size; ++r) {
    if (!seen[r]) return bad(absl::StrCat("no file for rank ", r));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  // Not through a symlink: a reader would parse (and quote in its errors)
  // whatever file the link names.
  absl::StatusOr<UniqueFd> fd = OpenRegularFileNoFollow(path);
  if (!fd.ok()) {
    if (absl::IsNotFound(fd.status())) {
      return absl::NotFoundError(absl::StrCat(dir, ": no manifest.json: not a committed checkpoint"));
    }
    return fd.status();
  }
  absl::StatusOr<std::string> text = ReadOpenFileToString(fd->get(), path, kMaxManifestBytes);
  if (!text.ok()) return text.status();
  return ParseManifest(*text, path);
}

absl::StatusOr<CheckpointManifest> ParseManifest(const std::string& text, const std::string& path) {
  CheckpointManifest m;
  try {
    constexpr int64_t kMaxInt = INT32_MAX;
    const json j = json::parse(text);
    m.format_version = static_cast<int>(IntIn(j, "format_version", 0, kMaxInt));
    if (m.format_version != 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported format_version ", m.format_version));
    }
    m.job = j.at("job").get<std::string>();
    m.step = IntIn(j, "step", 0, kMaxInt);
    m.total_steps = IntIn(j, "total_steps", 1, kMaxInt);
    m.data_step = IntIn(j, "data_step", 0, INT64_MAX);
    m.seed = static_cast<uint64_t>(IntIn(j, "seed", 0, INT64_MAX));
    const json& mo = j.at("model");
    m.model.family = mo.at("family").get<std::string>();
    m.model.n_layer = static_cast<int>(IntIn(mo, "n_layer", 1, 10000));
    m.model.n_head = static_cast<int>(IntIn(mo, "n_head", 1, 65536));
    m.model.n_embd = static_cast<int>(IntIn(mo, "n_embd", 1, 1 << 20));
    m.model.vocab_size = static_cast<int>(IntIn(mo, "vocab_size", 2, 1 << 24));
    m.model.block_size = static_cast<int>(IntIn(mo, "block_size", 1, 1 << 20));
    if (m.model.is_llama()) {
      ModelConfig& l = m.model;
      l.n_kv_head = static_cast<int>(IntIn(mo, "n_kv_head", 0, 65536));
      l.intermediate_size = static_cast<int>(IntIn(mo, "intermediate_size", 1, 1 << 22));
      l.head_dim_override = static_cast<int>(IntIn(mo, "head_dim", 0, 65536));
      l.rope_theta = mo.at("rope_theta").get<double>();
      l.rms_norm_eps = mo.at("rms_norm_eps").get<double>();
      l.qkv_bias = mo.at("qkv_bias").get<bool>();
      l.qk_norm = mo.at("qk_norm").get<bool>();
      l.tie_word_embeddings = mo.at("tie_word_embeddings").get<bool>();
      l.rope_scaling = mo.at("rope_scaling").get<std::string>();
      l.rope_scaling_factor = mo.at("rope_scaling_factor").get<double>();
      l.rope_low_freq_factor = mo.at("rope_low_freq_factor").get<double>();
      l.rope_high_freq_factor = mo.at("rope_high_freq_factor").get<double>();
      l.rope_original_max_position = static_cast<int>(IntIn(mo, "rope_original_max_position", 1, 1 << 24));
      if (mo.contains("max_position_embeddings")) {
        l.max_position_embeddings = static_cast<int>(IntIn(mo, "max_position_embeddings", 0, 1 << 24));
      }
    }
    if (mo.contains("hf_dir")) m.model.hf_dir = mo.at("hf_dir").get<std::string>();
    if (mo.contains("special_token_ids")) {  // manifests before it have none
      const json& ids = mo.at("special_token_ids");
      if (!ids.is_object() || ids.size() > 3) throw std::runtime_error("model.special_token_ids must be an object");
      absl::StatusOr<std::string> text = SpecialTokenIds(ids, "model.special_token_ids");
      if (!text.ok()) throw std::runtime_error(std::string(text.status().message()));
      m.model.special_token_ids = *text;
    }
    if (j.contains("lora")) {
      const json& l = j.at("lora");
      m.lora.enabled = true;
      m.lora.rank = static_cast<int>(IntIn(l, "rank", 1, 65536));
      m.lora.alpha = l.at("alpha").get<double>();
      m.lora.target_modules = l.at("target_modules").get<std::vector<std::string>>();
      const std::string base = l.at("base").get<std::string>();
      if (base != "sharded" && base != "replicated") throw std::runtime_error("lora.base must be sharded or replicated");
      m.lora.base = base == "sharded" ? LoraBase::kSharded : LoraBase::kReplicated;
      m.base_weights = l.at("base_weights").get<std::string>();
      if (l.contains("base_dtype")) {  // manifests before QLoRA have none: a base in param_dtype
        const std::string d = l.at("base_dtype").get<std::string>();
        if (d != "nf4" && d != "param_dtype") throw std::runtime_error("lora.base_dtype must be nf4 or param_dtype");
        m.lora.base_dtype = d == "nf4" ? LoraBaseDType::kNf4 : LoraBaseDType::kParamDType;
      }
      if (l.contains("base_digest")) {  // manifests before it have none
        m.lora.base_digest = l.at("base_digest").get<std::string>();
        if (m.lora.base_digest.size() != 64 || m.lora.base_digest.find_first_not_of("0123456789abcdef") != std::string::npos) {
          throw std::runtime_error("lora.base_digest must be 64 hex digits");
        }
      }
    }
    m.strategy = j.at("strategy").get<std::string>();
    m.world_size = static_cast<int>(IntIn(j, "world_size", 1, 1 << 20));
    m.shard_group_size = static_cast<int>(IntIn(j, "shard_group_size", 1, 1 << 20));
    for (const json& u : j.at("ownership")) {
      m.units.push_back({u.at("unit").get<std::string>(), IntIn(u, "numel", 1, INT64_MAX / 2),
                         IntIn(u, "padded", 1, INT64_MAX / 2), IntIn(u, "shard", 1, INT64_MAX / 2),
                         static_cast<int>(IntIn(u, "group_size", 1, 1 << 20))});
    }
    for (const json& r : j.at("ranks")) {
      m.ranks.push_back({static_cast<int>(IntIn(r, "rank", 0, 1 << 20)), r.at("file").get<std::string>(),
                         IntIn(r, "size", 0, INT64_MAX), r.at("sha256").get<std::string>()});
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": malformed manifest: ", Shown(e.what(), 256)));
  }
  absl::Status s = CheckManifest(m, path);
  if (!s.ok()) return s;
  return m;
}

namespace {

absl::Status CheckSameModel(const CheckpointManifest& m, const ModelConfig& model, const std::string& dir) {
  auto differ = [&](const char* key, int64_t have, int64_t want) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": checkpoint of another model: ", key, " = ", have,
                                                   " there, ", want, " in the job"));
  };
  if (m.model.family != model.family) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": checkpoint of another model family: ", Quoted(m.model.family)));
  }
  if (m.model.n_layer != model.n_layer) return differ("n_layer", m.model.n_layer, model.n_layer);
  if (m.model.n_head != model.n_head) return differ("n_head", m.model.n_head, model.n_head);
  if (m.model.n_embd != model.n_embd) return differ("n_embd", m.model.n_embd, model.n_embd);
  if (m.model.vocab_size != model.vocab_size) return differ("vocab_size", m.model.vocab_size, model.vocab_size);
  if (m.model.block_size != model.block_size) return differ("block_size", m.model.block_size, model.block_size);
  if (!model.is_llama()) return absl::OkStatus();
  if (m.model.kv_heads() != model.kv_heads()) return differ("n_kv_head", m.model.kv_heads(), model.kv_heads());
  if (m.model.intermediate_size != model.intermediate_size) {
    return differ("intermediate_size", m.model.intermediate_size, model.intermediate_size);
  }
  if (m.model.head_dim() != model.head_dim()) return differ("head_dim", m.model.head_dim(), model.head_dim());
  if (m.model.qkv_bias != model.qkv_bias) return differ("qkv_bias", m.model.qkv_bias, model.qkv_bias);
  if (m.model.qk_norm != model.qk_norm) return differ("qk_norm", m.model.qk_norm, model.qk_norm);
  if (m.model.tie_word_embeddings != model.tie_word_embeddings) {
    return differ("tie_word_embeddings", m.model.tie_word_embeddings, model.tie_word_embeddings);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSameTraining(const CheckpointManifest& m, const JobConfig& c, const std::string& dir) {
  absl::Status s = CheckSameModel(m, c.model, dir);
  if (!s.ok()) return s;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", what));
  };
  if (m.lora.enabled != c.lora.enabled) {
    return bad(m.lora.enabled ? "a LoRA checkpoint (adapters only): the job needs its [lora] table"
                              : "a checkpoint of the whole model: a [lora] job cannot resume from it");
  }
  if (!m.lora.enabled) return absl::OkStatus();
  std::vector<std::string> mine = model::LoraModules(c.model, c.lora), theirs = m.lora.target_modules;
  std::sort(mine.begin(), mine.end());
  std::sort(theirs.begin(), theirs.end());
  if (m.lora.rank != c.lora.rank || m.lora.alpha != c.lora.alpha || mine != theirs) {
    return bad(absl::StrCat("adapters of rank ", m.lora.rank, ", alpha ", m.lora.alpha, " on [",
                            absl::StrJoin(theirs, ", "), "] there; the job's [lora] has rank ", c.lora.rank, ", alpha ",
                            c.lora.alpha, " on [", absl::StrJoin(mine, ", "), "]"));
  }
  if (m.base_weights != LoraBaseWeights(c)) {
    return bad(absl::StrCat("adapters trained on the base ", Quoted(m.base_weights), ", the job's base is ",
                            Quoted(LoraBaseWeights(c))));
  }
  return CheckBaseDigest(m, c.model, dir);
}

absl::Status CheckBaseDigest(const CheckpointManifest& m, const ModelConfig& base, const std::string& dir) {
  if (m.lora.base_digest.empty()) return absl::OkStatus();  // written before digests were recorded
  absl::StatusOr<std::string> now = BaseWeightsDigest(base);
  if (!now.ok()) return absl::Status(now.status().code(), absl::StrCat(dir, ": its LoRA base: ", now.status().message()));
  if (*now == m.lora.base_digest) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      dir, ": the LoRA base at ", Quoted(m.base_weights, 256), " is not the one these adapters were trained on (",
      "its weights differ: base digest ", m.lora.base_digest.substr(0, 12), " recorded, ", now->substr(0, 12), " now)"));
}

}  // namespace shardline
