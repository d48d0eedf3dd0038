// Writes the seed corpora of the fuzz targets: small valid inputs made by the
// project's own writers (NewManifest + WriteManifest, SafetensorsStreamWriter)
// or taken from the tests and the demo (job files), and near-valid ones a
// byte or a field away. Run once and commit the output:
//   cmake --build build/fuzz --target make_corpus && build/fuzz/make_corpus tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/checkpoint/checkpoint_manifest.h"
#include "common/job/job_config.h"
#include "common/job/job_file.h"
#include "common/job/job_wire.h"
#include "common/model/hf_config.h"
#include "common/model/lora_adapter.h"
#include "common/model/safetensors.h"
#include "tests/unit/job_files.h"
#include "common/data/token_file_header.h"

namespace fs = std::filesystem;
using namespace shardline;

namespace {

fs::path out_root;

void Put(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = out_root / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary | std::ios::trunc) << bytes;
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  if (at == std::string::npos) {
    std::fprintf(stderr, "make_corpus: \"%s\" not found\n", from.c_str());
    std::exit(1);
  }
  return s.replace(at, from.size(), to);
}

void Die(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "make_corpus: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

// ---- job files ----
constexpr const char* kHybrid = test::kHybridJob;
// Every section, a llama model, LoRA, masks and checkpoints.
constexpr char kLlamaLora[] = R"([job]
name = "sft-llama"
workers = 4
[model]
family = "llama"
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 64
intermediate_size = 172
vocab_size = 300
block_size = 32
rope_theta = 500000.0
rms_norm_eps = 1e-5
tie_word_embeddings = false
rope_scaling = "llama3"
rope_scaling_factor = 8.0
rope_low_freq_factor = 1.0
rope_high_freq_factor = 4.0
rope_original_max_position = 8192
[data]
format = "llmc"
path = ["data/train_*.bin", "extra.bin"]
mask_path = ["data/train_*.mask", "extra.mask"]
val_path = "data/val.bin"
[train]
steps = 100
batch_size = 16
micro_batch_size = 2
seed = 7
eval_interval = 10
eval_batches = 4
[optimizer]
lr = 1e-4
min_lr = 1e-5
warmup_steps = 5
betas = [0.9, 0.999]
eps = 1e-8
weight_decay = 0.0
grad_clip = 0.5
[parallelism]
strategy = "hybrid_shard_zero2"
shard_group_size = 2
[precision]
param_dtype = "bf16"
reduce_dtype = "fp32"
buffer_dtype = "fp32"
allow_tf32 = true
[memory]
activation_checkpointing = true
cpu_offload = false
[prefetch]
forward = false
backward = "none"
max_inflight_all_gathers = 4
[lora]
rank = 4
alpha = 8
target_modules = "all-linear"
dropout = 0
base = "replicated"
[checkpoint]
dir = "ckpt"
interval = 10
keep_latest = 2
async = false
)";

void JobFiles() {
  Put("job_config", "hybrid.toml", kHybrid);
  // The files users copy (run from the repository's root).
  for (const auto& e : fs::directory_iterator("examples")) {
    if (e.path().extension() == ".toml") Put("job_config", "example-" + e.path().filename().string(), Slurp(e.path()));
  }
  Put("job_config", "llama_lora.toml", kLlamaLora);
  Put("job_config", "qwen3.toml", R"([model]
family = "llama"
n_layer = 1
n_head = 2
n_embd = 16
head_dim = 16
qk_norm = true
qkv_bias = true
tie_word_embeddings = true
intermediate_size = 32
vocab_size = 128
[lora]
target_modules = ["q_proj", "v_proj"]
)");
  Put("job_config", "inline_tables.toml",
      "model = { n_layer = 1, n_head = 1, n_embd = 8 }\njob.name = 'x'\n[train]\nsteps = 1_000\nseed = 0x10\n");
  // Near-valid: each a one-line error.
  Put("job_config", "bad_divisible.toml", Replace(kHybrid, "n_embd = 32", "n_embd = 30"));
  Put("job_config", "bad_range.toml", Replace(kHybrid, "n_layer = 2", "n_layer = 99999999999"));
  Put("job_config", "bad_type.toml", Replace(kHybrid, "steps = 5", "steps = \"5\""));
  Put("job_config", "bad_key.toml", Replace(kHybrid, "block_size", "blocksize"));
  Put("job_config", "bad_toml.toml", Replace(kHybrid, "[train]", "[train"));
  Put("job_config", "bad_strategy.toml", Replace(Slurp("examples/tiny-gpt.toml"), "full_shard", "fullshard"));
  // The same target decodes its input as a resolved spec on the wire too.
  absl::StatusOr<JobConfig> lora = ParseJobConfig(kLlamaLora, "job.toml");
  if (lora.ok()) {
    Put("job_config", "wire_llama_lora.json", EncodeJobConfig(*lora));
    Put("job_config", "wire_bad_narrowed.json",
        Replace(EncodeJobConfig(*lora), "\"n_layer\":", "\"n_layer\":1099511627776000"));
  }
}

// ---- safetensors ----
std::string WriteSafetensors(const fs::path& dir, const std::string& name,
                             const std::vector<SafetensorsStreamWriter::Decl>& decls, StoredDType dtype) {
  const std::string path = (dir / name).string();
  auto w = SafetensorsStreamWriter::Create(path, decls, dtype);
  Die(w.status());
  for (const auto& d : decls) {
    int64_t n = 1;
    for (int64_t x : d.shape) n *= x;
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * static_cast<float>(i);
    Die((*w)->Append(v.data(), n));
  }
  Die((*w)->Finish());
  return Slurp(path);
}

std::string RawSafetensors(const std::string& json, size_t data_bytes) {
  const uint64_t len = json.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &len, 8);
  return s + json + std::string(data_bytes, '\x01');
}

void SafetensorsFiles(const fs::path& tmp) {
  Put("safetensors", "f32.safetensors",
      WriteSafetensors(tmp, "f32.safetensors", {{"wte.weight", {4, 3}}, {"ln_f.bias", {3}}}, StoredDType::kF32));
  Put("safetensors", "bf16.safetensors",
      WriteSafetensors(tmp, "bf16.safetensors", {{"model.embed_tokens.weight", {2, 4}}, {"scalar", {}}},
                       StoredDType::kBF16));
  Put("safetensors", "empty.safetensors", RawSafetensors("{}", 0));
  Put("safetensors", "other_dtypes.safetensors",
      RawSafetensors(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                     R"("b":{"dtype":"I64","shape":[1,1],"data_offsets":[4,12]},)"
                     R"("c":{"dtype":"F8_E4M3","shape":[0],"data_offsets":[12,12]},)"
                     R"("d":{"dtype":"X9","shape":[3],"data_offsets":[12,13]},)"
                     R"("__metadata__":{"format":"pt","note":"x"}})",
                     13));
  // Near-valid.
  Put("safetensors", "overlap.safetensors",
      RawSafetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     8));
  Put("safetensors", "outside.safetensors",
      RawSafetensors(R"({"a":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}})", 8));
  Put("safetensors", "wrong_size.safetensors",
      RawSafetensors(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", 4));
  std::string big = RawSafetensors("{}", 0);
  big[7] = '\x7f';  // a length past the end
  Put("safetensors", "bad_length.safetensors", big);
}

// ---- manifests ----
void Manifests(const fs::path& tmp) {
  auto write = [&](const std::string& name, const JobConfig& c, int world, int64_t step) {
    absl::StatusOr<CheckpointManifest> m = NewManifest("job-1", c, world, step);
    Die(m.status());
    for (int r = 0; r < m->shard_group_size; ++r) {
      m->ranks.push_back({r, RankFileName(r), 1000 + r, std::string(64, 'a' + r % 6)});
    }
    const fs::path dir = tmp / name;
    fs::create_directories(dir);
    Die(WriteManifest(dir.string(), *m));
    const std::string text = Slurp(dir / "manifest.json");
    Die(ParseManifest(text, name).status());
    Put("manifest", name + ".json", text);
    return text;
  };
  JobConfig gpt;
  gpt.model.n_layer = 2;
  gpt.model.n_head = 4;
  gpt.model.n_embd = 32;
  gpt.model.vocab_size = 64;
  gpt.model.block_size = 16;
  const std::string good = write("gpt2_world2", gpt, 2, 4);

  JobConfig llama = gpt;
  llama.model.family = "llama";
  llama.model.n_kv_head = 2;
  llama.model.intermediate_size = 48;
  llama.model.rope_scaling = "llama3";
  llama.parallelism.strategy = Strategy::kHybridShard;
  llama.parallelism.shard_group_size = 2;
  llama.lora.enabled = true;
  llama.lora.rank = 2;
  llama.lora.alpha = 4;
  llama.lora.target_modules = {"all-linear"};
  llama.model.hf_dir = "/models/llama";
  write("llama_lora_world4", llama, 4, 10);

  JobConfig qwen = llama;
  qwen.lora = LoraConfig();
  qwen.model.hf_dir.clear();
  qwen.model.qkv_bias = true;
  qwen.model.tie_word_embeddings = true;
  qwen.model.max_position_embeddings = 64;
  qwen.parallelism.strategy = Strategy::kNoShard;
  write("qwen2_no_shard", qwen, 3, 0);

  // Near-valid.
  Put("manifest", "bad_numel.json", Replace(good, "\"numel\": 2560", "\"numel\": 2559"));
  Put("manifest", "bad_rank_file.json", Replace(good, "\"rank-00001.safetensors\"", "\"../rank-00001.safetensors\""));
  Put("manifest", "bad_version.json", Replace(good, "\"format_version\": 1", "\"format_version\": 2"));
  Put("manifest", "bad_group.json", Replace(good, "\"shard_group_size\": 2", "\"shard_group_size\": 3"));
  Put("manifest", "bad_type.json", Replace(good, "\"step\": 4", "\"step\": 4.5"));
}

// ---- token file headers ----
std::string TokenFile(int32_t magic, int32_t version, int32_t count, size_t payload_bytes) {
  int32_t header[256] = {0};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string s(reinterpret_cast<const char*>(header), sizeof(header));
  for (size_t i = 0; i < payload_bytes; ++i) s.push_back(static_cast<char>(i % 2));
  return s;
}

void TokenHeaders() {
  Put("token_header", "gpt2.bin", TokenFile(kLlmcMagic, kLlmcVersion, 8, 16));
  Put("token_header", "llama3.bin", TokenFile(kLlmcLlama3Magic, kLlmcLlama3Version, 4, 16));
  Put("token_header", "mask.mask", TokenFile(kLossMaskMagic, kLossMaskVersion, 8, 8));
  Put("token_header", "empty.bin", TokenFile(kLlmcMagic, kLlmcVersion, 0, 0));
  // Near-valid.
  Put("token_header", "truncated.bin", TokenFile(kLlmcMagic, kLlmcVersion, 9, 16));
  Put("token_header", "wrong_version.bin", TokenFile(kLlmcLlama3Magic, kLlmcVersion, 4, 16));
  Put("token_header", "negative_count.bin", TokenFile(kLlmcMagic, kLlmcVersion, -1, 0));
  Put("token_header", "short_header.bin", TokenFile(kLlmcMagic, kLlmcVersion, 0, 0).substr(0, 1000));
}

// hf_json inputs: a first byte 'c' (config.json) or 'a' (adapter_config.json),
// then the text the project's own writers produce for the job files above.
void HfJsonFiles() {
  auto model_of = [](const char* toml) {
    absl::StatusOr<JobConfig> c = ParseJobConfig(toml, "seed.toml");
    Die(c.status());
    return *c;
  };
  const JobConfig gpt2 = model_of(kHybrid), llama = model_of(kLlamaLora);
  JobConfig qwen3 = llama;
  qwen3.model.qk_norm = true;
  qwen3.model.rope_scaling = "none";
  Put("hf_json", "gpt2.json", "c" + HfConfigJson(gpt2.model, "float32"));
  Put("hf_json", "llama3.json", "c" + HfConfigJson(llama.model, "bfloat16"));
  Put("hf_json", "qwen3.json", "c" + HfConfigJson(qwen3.model, "bfloat16"));
  Put("hf_json", "moe.json", Replace("c" + HfConfigJson(llama.model, "bfloat16"), "{", "{\"num_experts\": 8, "));
  // Adapters for the fuzz target's fixed GPT-2 (n_embd 32, 2 layers).
  LoraConfig lora;
  lora.rank = 8;
  lora.alpha = 16;
  lora.target_modules = {"c_attn", "c_proj"};
  Put("hf_json", "adapter.json", "a" + PeftAdapterConfigJson(gpt2.model, lora, "gpt2"));
  lora.target_modules = {"all-linear"};
  Put("hf_json", "adapter_all_linear.json", "a" + PeftAdapterConfigJson(gpt2.model, lora, "gpt2"));
  Put("hf_json", "adapter_dora.json",
      Replace("a" + PeftAdapterConfigJson(gpt2.model, lora, "gpt2"), "{", "{\"use_dora\": true, "));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus CORPUS_DIR\n");
    return 2;
  }
  out_root = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("shardline-corpus-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  JobFiles();
  SafetensorsFiles(tmp);
  Manifests(tmp);
  TokenHeaders();
  HfJsonFiles();
  fs::remove_all(tmp);
  return 0;
}
