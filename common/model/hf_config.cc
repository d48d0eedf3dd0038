#include "common/model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/json_object.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"

namespace shardline {

using nlohmann::json;

namespace {

std::string Show(const std::string& v) { return Quoted(v); }
std::string Show(bool v) { return v ? "true" : "false"; }
template <typename T>
std::string Show(T v) { return absl::StrCat(v); }

// Reads config.json's values into a ModelConfig, checking each against the
// job file's explicit [model] keys.
class ConfigReader {
 public:
  ConfigReader(const json& j, const std::string& file, const std::string& source, ModelConfig* m)
      : j_(j), file_(file), source_(source), m_(m) {}

  const json& j() const { return j_; }
  const std::string& file() const { return file_; }
  const absl::Status& status() const { return status_; }
  void Fail(const std::string& msg) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(msg);
  }
  // `file`: <key> ...: an unsupported feature.
  void Refuse(const std::string& key, const std::string& why) {
    Fail(absl::StrCat(file_, ": ", key, ": ", why, " (not supported)"));
  }

  bool Has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  // config.json's value of `key`, or `fallback` where it is absent or null.
  template <typename T>
  T Get(const std::string& key, T fallback) {
    if (!Has(key)) return fallback;
    // nlohmann casts a float to an integer type unchecked (undefined out of
    // range): integers must be written as integers.
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (!j_.at(key).is_number_integer()) {
        Fail(absl::StrCat(file_, ": ", key, " must be an integer"));
        return fallback;
      }
    }
    try {
      return j_.at(key).get<T>();
    } catch (const std::exception&) {
      Fail(absl::StrCat(file_, ": ", key, " has the wrong type"));
      return fallback;
    }
  }
  // Sets [model] `toml_key` to `value` (config.json's `hf_key`), unless the
  // job file set it to something else.
  template <typename T>
  void Set(const std::string& toml_key, const std::string& hf_key, T* field, T value) {
    if (m_->explicit_keys.count(toml_key) && *field != value) {
      Fail(absl::StrCat(source_, ": [model] ", toml_key, " = ", Show(*field), " contradicts ", file_, " ", hf_key,
                        " = ", Show(value)));
    }
    *field = value;
  }
  // An integer size that must be positive and fit an int.
  int Size(const std::string& key, int64_t fallback = -1) {
    const int64_t v = Get<int64_t>(key, fallback);
    if (v < 1 || v > (int64_t{1} << 30)) Fail(absl::StrCat(file_, ": ", key, " = ", v, " is not a valid size"));
    return static_cast<int>(std::clamp<int64_t>(v, 1, int64_t{1} << 30));
  }

 private:
  const json& j_;
  std::string file_, source_;
  ModelConfig* m_;
  absl::Status status_;
};

void ReadGpt2(ConfigReader& r, ModelConfig& m, int* max_positions) {
  r.Set<int>("n_embd", "n_embd", &m.n_embd, r.Size("n_embd"));
  r.Set<int>("n_layer", "n_layer", &m.n_layer, r.Size("n_layer"));
  r.Set<int>("n_head", "n_head", &m.n_head, r.Size("n_head"));
  r.Set<int>("vocab_size", "vocab_size", &m.vocab_size, r.Size("vocab_size"));
  *max_positions = r.Size("n_positions", 1024);
  if (r.Has("n_inner") && r.Get<int64_t>("n_inner", 0) != 4 * int64_t{m.n_embd}) {
    r.Refuse("n_inner", "an MLP width other than 4 * n_embd");
  }
  const std::string act = r.Get<std::string>("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") r.Refuse("activation_function", Show(act));
  if (r.Get<double>("layer_norm_epsilon", 1e-5) != 1e-5) r.Refuse("layer_norm_epsilon", "a value other than 1e-5");
  if (r.Get<bool>("scale_attn_by_inverse_layer_idx", false)) r.Refuse("scale_attn_by_inverse_layer_idx", "true");
  if (!r.Get<bool>("scale_attn_weights", true)) r.Refuse("scale_attn_weights", "false");
  if (r.Get<bool>("add_cross_attention", false)) r.Refuse("add_cross_attention", "true");
  if (!r.Get<bool>("tie_word_embeddings", true)) r.Refuse("tie_word_embeddings", "false for gpt2");
}

// rope_parameters (transformers 5) or the older rope_theta + rope_scaling.
void ReadRope(ConfigReader& r, ModelConfig& m) {
  json rope = r.Has("rope_parameters") ? r.j().at("rope_parameters")
                                       : (r.Has("rope_scaling") ? r.j().at("rope_scaling") : json::object());
  if (!rope.is_object()) {
    r.Refuse("rope_parameters", "not an object");
    return;
  }
  auto get = [&](const char* key, double fallback) {
    return rope.contains(key) && rope.at(key).is_number() ? rope.at(key).get<double>() : fallback;
  };
  r.Set<double>("rope_theta", "rope_theta", &m.rope_theta, get("rope_theta", r.Get<double>("rope_theta", 10000.0)));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (rope.contains(key) && rope.at(key).is_string()) type = rope.at(key).get<std::string>();
  }
  if (type == "default") {
    r.Set<std::string>("rope_scaling", "rope_type", &m.rope_scaling, "none");
  } else if (type == "llama3") {
    r.Set<std::string>("rope_scaling", "rope_type", &m.rope_scaling, "llama3");
    r.Set<double>("rope_scaling_factor", "factor", &m.rope_scaling_factor, get("factor", 8.0));
    r.Set<double>("rope_low_freq_factor", "low_freq_factor", &m.rope_low_freq_factor, get("low_freq_factor", 1.0));
    r.Set<double>("rope_high_freq_factor", "high_freq_factor", &m.rope_high_freq_factor,
                  get("high_freq_factor", 4.0));
    // A double that becomes an int: out of range, the cast is undefined.
    const double original = get("original_max_position_embeddings", 8192);
    if (!(original >= 1 && original <= (1 << 30)) || original != std::floor(original)) {
      r.Fail(absl::StrCat(r.file(), ": rope original_max_position_embeddings = ", original, " is not a valid size"));
      return;
    }
    r.Set<int>("rope_original_max_position", "original_max_position_embeddings", &m.rope_original_max_position,
               static_cast<int>(original));
  } else {
    r.Refuse("rope_type", Show(type));
  }
}

void ReadLlama(ConfigReader& r, const std::string& type, ModelConfig& m, int* max_positions) {
  r.Set<int>("n_embd", "hidden_size", &m.n_embd, r.Size("hidden_size"));
  r.Set<int>("n_layer", "num_hidden_layers", &m.n_layer, r.Size("num_hidden_layers"));
  r.Set<int>("n_head", "num_attention_heads", &m.n_head, r.Size("num_attention_heads"));
  r.Set<int>("n_kv_head", "num_key_value_heads", &m.n_kv_head, r.Size("num_key_value_heads", m.n_head));
  r.Set<int>("intermediate_size", "intermediate_size", &m.intermediate_size, r.Size("intermediate_size"));
  r.Set<int>("vocab_size", "vocab_size", &m.vocab_size, r.Size("vocab_size"));
  // Qwen3's configuration class defaults head_dim to 128, the others to
  // hidden_size / num_attention_heads.
  const int head_dim = r.Size("head_dim", type == "qwen3" ? 128 : m.n_embd / std::max(m.n_head, 1));
  r.Set<int>("head_dim", "head_dim", &m.head_dim_override, head_dim);
  r.Set<double>("rms_norm_eps", "rms_norm_eps", &m.rms_norm_eps, r.Get<double>("rms_norm_eps", 1e-6));
  r.Set<bool>("tie_word_embeddings", "tie_word_embeddings", &m.tie_word_embeddings,
              r.Get<bool>("tie_word_embeddings", false));
  r.Set<bool>("qkv_bias", "model_type", &m.qkv_bias, type == "qwen2");
  r.Set<bool>("qk_norm", "model_type", &m.qk_norm, type == "qwen3");
  *max_positions = r.Size("max_position_embeddings", 2048);
  ReadRope(r, m);
  const std::string act = r.Get<std::string>("hidden_act", "silu");
  if (act != "silu") r.Refuse("hidden_act", Show(act));
  if (r.Get<bool>("attention_bias", false)) r.Refuse("attention_bias", "true (an o_proj bias)");
  if (r.Get<bool>("mlp_bias", false)) r.Refuse("mlp_bias", "true");
  for (const char* moe : {"num_experts", "num_local_experts"}) {
    if (r.Get<int64_t>(moe, 0) > 0) r.Refuse(moe, "a mixture of experts");
  }
  // A window at least as long as the sequence masks nothing the causal mask
  // does not already.
  const bool windowed = type == "mistral" ? r.Has("sliding_window") : r.Get<bool>("use_sliding_window", false);
  if (windowed && r.Get<int64_t>("sliding_window", 0) < m.block_size) {
    r.Refuse("sliding_window", absl::StrCat(r.Get<int64_t>("sliding_window", 0), ", shorter than block_size ",
                                            m.block_size, " (sliding-window attention)"));
  }
}

// config.json's special token ids as an object's text: each an id, a list of
// ids (several end tokens) or null, as transformers writes them.
}  // namespace

absl::StatusOr<std::string> SpecialTokenIds(const json& j, const std::string& file) {
  json ids = json::object();
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (!j.contains(key)) continue;
    const json& v = j.at(key);
    bool ok = v.is_null() || v.is_number_unsigned() || (v.is_array() && v.size() <= 64);
    if (v.is_array()) {
      for (const json& e : v) ok = ok && e.is_number_unsigned();
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", key, " must be a token id, a list of at most 64 ids, or null"));
    }
    ids[key] = v;
  }
  return ids.empty() ? std::string() : ids.dump();
}


absl::Status ApplyHfConfig(JobConfig& c, const std::string& source) {
  ModelConfig& m = c.model;
  if (m.hf_dir.empty()) return absl::OkStatus();
  if (!m.init_from.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": [model] init_from and hf_dir both name initial weights; set one"));
  }
  const std::string file = m.hf_dir + "/config.json";
  absl::StatusOr<std::string> text = ReadFileToString(file, "[model] hf_dir config");
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat(source, ": ", text.status().message()));
  absl::StatusOr<json> parsed = ParseJsonObject(*text, file);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  ConfigReader r(j, file, source, &m);
  const std::string type = r.Get<std::string>("model_type", "");
  if (r.Has("architectures") && j.at("architectures").is_array() && !j.at("architectures").empty() &&
      j.at("architectures")[0].is_string()) {
    const std::string arch = j.at("architectures")[0].get<std::string>();
    if (!absl::EndsWith(arch, "ForCausalLM") && arch != "GPT2LMHeadModel") {
      return absl::InvalidArgumentError(absl::StrCat(file, ": architectures = ", Show(arch),
                                                     " is not a causal language model (not supported)"));
    }
  }
  int max_positions = 0;
  if (type == "gpt2") {
    r.Set<std::string>("family", "model_type", &m.family, "gpt2");
    ReadGpt2(r, m, &max_positions);
  } else if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3") {
    r.Set<std::string>("family", "model_type", &m.family, "llama");
    ReadLlama(r, type, m, &max_positions);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(file, ": model_type = ", Show(type),
                                                   " is not supported (gpt2, llama, mistral, qwen2, qwen3)"));
  }
  if (!r.status().ok()) return r.status();
  SL_ASSIGN_OR_RETURN(m.special_token_ids, SpecialTokenIds(j, file));
  if (m.is_llama()) m.max_position_embeddings = max_positions;
  if (!m.explicit_keys.count("block_size")) m.block_size = std::min(m.block_size, max_positions);
  if (m.block_size > max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": [model] block_size = ", m.block_size, " exceeds ", file,
                                                   " ", type == "gpt2" ? "n_positions" : "max_position_embeddings",
                                                   " = ", max_positions));
  }
  return absl::OkStatus();
}

bool HfStoredTransposed(const ModelConfig& m, const std::string& name) {
  if (m.is_llama()) return false;
  return absl::EndsWith(name, "attn.c_attn.weight") || absl::EndsWith(name, "attn.c_proj.weight") ||
         absl::EndsWith(name, "mlp.c_fc.weight") || absl::EndsWith(name, "mlp.c_proj.weight");
}

std::string HfConfigJson(const ModelConfig& m, const std::string& torch_dtype) {
  json j;
  if (!m.is_llama()) {
    j = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"n_embd", m.n_embd},
         {"n_layer", m.n_layer}, {"n_head", m.n_head}, {"vocab_size", m.vocab_size},
         {"n_positions", m.block_size}, {"n_inner", nullptr}, {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", 1e-5}, {"tie_word_embeddings", true}, {"attn_pdrop", 0.0},
         {"embd_pdrop", 0.0}, {"resid_pdrop", 0.0}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}};
  } else {
    const std::string type = m.qk_norm ? "qwen3" : m.qkv_bias ? "qwen2" : "llama";
    const std::string arch = m.qk_norm ? "Qwen3ForCausalLM" : m.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    json rope = {{"rope_theta", m.rope_theta}, {"rope_type", "default"}};
    if (m.rope_scaling == "llama3") {
      rope = {{"rope_theta", m.rope_theta}, {"rope_type", "llama3"}, {"factor", m.rope_scaling_factor},
              {"low_freq_factor", m.rope_low_freq_factor}, {"high_freq_factor", m.rope_high_freq_factor},
              {"original_max_position_embeddings", m.rope_original_max_position}};
    }
    j = {{"architectures", {arch}}, {"model_type", type}, {"hidden_size", m.n_embd},
         {"num_hidden_layers", m.n_layer}, {"num_attention_heads", m.n_head},
         {"num_key_value_heads", m.kv_heads()}, {"head_dim", m.head_dim()},
         {"intermediate_size", m.intermediate_size}, {"vocab_size", m.vocab_size},
         {"max_position_embeddings", std::max(m.block_size, m.max_position_embeddings)},
         {"rms_norm_eps", m.rms_norm_eps}, {"rope_parameters", rope}, {"rope_theta", m.rope_theta},
         {"hidden_act", "silu"}, {"tie_word_embeddings", m.tied()}, {"attention_bias", false},
         {"attention_dropout", 0.0}, {"use_sliding_window", false}, {"sliding_window", nullptr},
         {"bos_token_id", nullptr}, {"eos_token_id", nullptr}};
    if (type == "llama") j["mlp_bias"] = false;
  }
  // The source's token ids (special_token_ids), so that generate() stops
  // where the source model did.
  if (!m.special_token_ids.empty()) j.update(json::parse(m.special_token_ids));
  j["dtype"] = torch_dtype;
  j["initializer_range"] = 0.02;
  return j.dump(2) + "\n";
}

}  // namespace shardline
