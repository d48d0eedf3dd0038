#include "common/checkpoint_manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"

namespace shardline {

using nlohmann::json;

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

CheckpointManifest NewManifest(const std::string& job, const JobConfig& c, int world_size, int64_t step,
                               const std::vector<ShardLayout>& ownership) {
  CheckpointManifest m;
  m.job = job;
  m.step = step;
  m.total_steps = c.train.steps;
  m.data_step = step;  // data order is a function of the global step alone
  m.seed = c.train.seed;
  m.model = c.model;
  m.strategy = StrategyName(c.parallelism.strategy);
  m.world_size = world_size;
  m.shard_group_size = ownership.empty() ? 1 : ownership.front().group_size;
  for (const ShardLayout& l : ownership) m.units.push_back({l.unit, l.numel, l.padded_numel, l.shard_numel, l.group_size});
  return m;
}

absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& m) {
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
  return WriteFileAtomically(dir + "/manifest.json", j.dump(2) + "\n");
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(dir, ": no manifest.json: not a committed checkpoint"));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    const json j = json::parse(ss.str());
    CheckpointManifest m;
    m.format_version = j.at("format_version").get<int>();
    m.job = j.at("job").get<std::string>();
    m.step = j.at("step").get<int64_t>();
    m.total_steps = j.at("total_steps").get<int64_t>();
    m.data_step = j.at("data_step").get<int64_t>();
    m.seed = j.at("seed").get<uint64_t>();
    const json& mo = j.at("model");
    m.model.family = mo.at("family").get<std::string>();
    m.model.n_layer = mo.at("n_layer").get<int>();
    m.model.n_head = mo.at("n_head").get<int>();
    m.model.n_embd = mo.at("n_embd").get<int>();
    m.model.vocab_size = mo.at("vocab_size").get<int>();
    m.model.block_size = mo.at("block_size").get<int>();
    if (m.model.is_llama()) {
      ModelConfig& l = m.model;
      l.n_kv_head = mo.at("n_kv_head").get<int>();
      l.intermediate_size = mo.at("intermediate_size").get<int>();
      l.head_dim_override = mo.at("head_dim").get<int>();
      l.rope_theta = mo.at("rope_theta").get<double>();
      l.rms_norm_eps = mo.at("rms_norm_eps").get<double>();
      l.qkv_bias = mo.at("qkv_bias").get<bool>();
      l.qk_norm = mo.at("qk_norm").get<bool>();
      l.tie_word_embeddings = mo.at("tie_word_embeddings").get<bool>();
      l.rope_scaling = mo.at("rope_scaling").get<std::string>();
      l.rope_scaling_factor = mo.at("rope_scaling_factor").get<double>();
      l.rope_low_freq_factor = mo.at("rope_low_freq_factor").get<double>();
      l.rope_high_freq_factor = mo.at("rope_high_freq_factor").get<double>();
      l.rope_original_max_position = mo.at("rope_original_max_position").get<int>();
      l.max_position_embeddings = mo.value("max_position_embeddings", 0);
    }
    m.strategy = j.at("strategy").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.shard_group_size = j.at("shard_group_size").get<int>();
    for (const json& u : j.at("ownership")) {
      m.units.push_back({u.at("unit").get<std::string>(), u.at("numel").get<int64_t>(),
                         u.at("padded").get<int64_t>(), u.at("shard").get<int64_t>(), u.at("group_size").get<int>()});
    }
    for (const json& r : j.at("ranks")) {
      m.ranks.push_back({r.at("rank").get<int>(), r.at("file").get<std::string>(), r.at("size").get<int64_t>(),
                         r.at("sha256").get<std::string>()});
    }
    if (m.format_version != 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported format_version ", m.format_version));
    }
    return m;
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": malformed manifest: ", e.what()));
  }
}

absl::Status CheckSameModel(const CheckpointManifest& m, const ModelConfig& model, const std::string& dir) {
  auto differ = [&](const char* key, int64_t have, int64_t want) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": checkpoint of another model: ", key, " = ", have,
                                                   " there, ", want, " in the job"));
  };
  if (m.model.family != model.family) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": checkpoint of another model family: ", m.model.family));
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

}  // namespace shardline
