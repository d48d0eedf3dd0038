// The resolved job spec on the wire (common/job/job_wire.h): what the
// coordinator sends is what the worker runs, field for field, and a spec that
// is damaged or forged is refused naming the field, never narrowed.
#include "common/job/job_wire.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace shardline {
namespace {

// How many fields an aggregate has: the most initializers T{...} takes.
struct AnyField {
  template <typename U>
  operator U() const;
};
template <typename T, typename... A>
constexpr auto Braces(int) -> decltype(T{std::declval<A>()...}, true) {
  return true;
}
template <typename T, typename... A>
constexpr bool Braces(...) {
  return false;
}
template <typename T, typename... A>
constexpr size_t FieldCount() {
  if constexpr (Braces<T, A..., AnyField>(0)) {
    return FieldCount<T, A..., AnyField>();
  } else {
    return sizeof...(A);
  }
}

// A field added to one of JobConfig's structs must be added to job_wire.cc's
// list too, or workers run it at its default: each struct's encoded object
// has as many keys as the struct has fields.
TEST(JobWire, EveryStructsEveryFieldIsEncoded) {
  const nlohmann::json j = nlohmann::json::parse(EncodeJobConfig(JobConfig()));
  EXPECT_EQ(j.size(), FieldCount<JobConfig>());
  EXPECT_EQ(j.at("model").size(), FieldCount<ModelConfig>());
  EXPECT_EQ(j.at("data").size(), FieldCount<DataConfig>());
  EXPECT_EQ(j.at("data").at("train").size(), FieldCount<TokenSource>());
  EXPECT_EQ(j.at("train").size(), FieldCount<TrainConfig>());
  EXPECT_EQ(j.at("optimizer").size(), FieldCount<OptimizerConfig>());
  EXPECT_EQ(j.at("parallelism").size(), FieldCount<ParallelismConfig>());
  EXPECT_EQ(j.at("precision").size(), FieldCount<PrecisionConfig>());
  EXPECT_EQ(j.at("memory").size(), FieldCount<MemoryConfig>());
  EXPECT_EQ(j.at("prefetch").size(), FieldCount<PrefetchConfig>());
  EXPECT_EQ(j.at("lora").size(), FieldCount<LoraConfig>());
  EXPECT_EQ(j.at("checkpoint").size(), FieldCount<CheckpointConfig>());
  EXPECT_EQ(j.at("restart").size(), FieldCount<RestartConfig>());
}

// Every field away from its default, so that one the wire drops shows.
JobConfig EveryFieldSet() {
  JobConfig c;
  c.name = "wire \xc3\xa9";
  c.workers = 5;
  c.restart = {7, 2, 12.5};
  ModelConfig& m = c.model;
  m.family = "llama";
  m.n_layer = 3, m.n_head = 6, m.n_embd = 96, m.vocab_size = 1000, m.block_size = 64;
  m.init_from = "/w/init.safetensors";
  m.hf_dir = "/w/hf";
  m.explicit_keys = {"n_layer", "block_size"};
  m.n_kv_head = 2, m.intermediate_size = 200, m.head_dim_override = 32;
  m.rope_theta = 500000.0, m.rms_norm_eps = 1e-5;
  m.qkv_bias = m.qk_norm = m.tie_word_embeddings = true;
  m.rope_scaling = "llama3";
  m.rope_scaling_factor = 32.0, m.rope_low_freq_factor = 2.0, m.rope_high_freq_factor = 8.0;
  m.rope_original_max_position = 4096, m.max_position_embeddings = 131072;
  m.special_token_ids = R"({"bos_token_id":1,"eos_token_id":[2,7]})";
  c.data.format = DataFormat::kLlmc;
  c.data.train = {{"/d/a-*.bin", "/d/b.bin"}, {"/d/a.mask"}, {"/d/a.docs"}};
  c.data.val = {{"/d/val.bin"}, {"/d/val.mask"}, {"/d/val.docs"}};
  c.train = {17, 12, 3, 2.5, 999, GradAccumulation::kUnsharded, true, 0xFFFFFFFFFFFFFFF1ull, 5, 4, 2, 3};
  c.optimizer = {3e-4, 1e-5, 7, LrSchedule::kWsd, 4, {0.8, 0.99}, 1e-7, 0.01, 0.5, DType::kBFloat16, MomentsDType::kDynamic8Bit};
  c.parallelism = {Strategy::kHybridShardZero2, true, 2, true, true, true};
  c.precision = {DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, true};
  c.memory = {true, true, false};
  c.prefetch = {false, BackwardPrefetch::kPost, 4};
  c.lora.enabled = true;
  c.lora.rank = 16, c.lora.alpha = 32, c.lora.dropout = 0.05;
  c.lora.target_modules = {"q_proj", "v_proj"};
  c.lora.init_from = "/w/adapter";
  c.lora.base = LoraBase::kReplicated;
  c.lora.base_dtype = LoraBaseDType::kNf4;
  c.lora.explicit_keys = {"rank"};
  c.lora.base_digest = std::string(64, 'a');
  c.checkpoint = {"/ck", 9, 1, 30.5, false, false};
  return c;
}

// Each leaf of `a` that equals the same leaf of `b`, as JSON pointers.
std::vector<std::string> SameLeaves(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::string> same;
  const nlohmann::json fa = a.flatten(), fb = b.flatten();
  for (auto it = fa.begin(); it != fa.end(); ++it) {
    if (fb.contains(it.key()) && fb.at(it.key()) == it.value()) same.push_back(it.key());
  }
  return same;
}

TEST(JobWire, EveryFieldTravels) {
  const JobConfig sent = EveryFieldSet();
  const std::string text = EncodeJobConfig(sent);
  // The test's premise: no encoded field is at its default.
  EXPECT_EQ(SameLeaves(nlohmann::json::parse(text), nlohmann::json::parse(EncodeJobConfig(JobConfig()))),
            std::vector<std::string>{});
  absl::StatusOr<JobConfig> got = DecodeJobConfig(text, "job-1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(EncodeJobConfig(*got), text);
  EXPECT_EQ(got->train.seed, 0xFFFFFFFFFFFFFFF1ull);
  EXPECT_EQ(got->optimizer.lr, 3e-4);  // doubles exactly
  EXPECT_EQ(got->model.max_position_embeddings, 131072);
  EXPECT_EQ(got->lora.base_digest, std::string(64, 'a'));
  EXPECT_TRUE(got->parallelism.auto_strategy);
  EXPECT_EQ(got->parallelism.strategy, Strategy::kHybridShardZero2);
}

// A damaged or forged spec: refused, naming the field, never narrowed.
TEST(JobWire, ADamagedSpecIsRefusedNamingTheField) {
  nlohmann::json good = nlohmann::json::parse(EncodeJobConfig(EveryFieldSet()));
  auto refusal = [](const nlohmann::json& j) {
    absl::StatusOr<JobConfig> c = DecodeJobConfig(j.dump(), "job-7");
    return c.ok() ? std::string("accepted") : std::string(c.status().message());
  };
  nlohmann::json j = good;
  j["model"]["n_layer"] = int64_t{1} << 40;
  EXPECT_EQ(refusal(j), "job-7: job spec: /model/n_layer: not a value of its field's type and range, or no such field");
  j = good;
  j["train"]["steps"] = 1.5;
  EXPECT_EQ(refusal(j), "job-7: job spec: /train/steps: not a value of its field's type and range, or no such field");
  j = good;
  j["precision"]["extra"] = 1;
  EXPECT_EQ(refusal(j),
            "job-7: job spec: /precision/extra: not a value of its field's type and range, or no such field");
  j = good;
  j["parallelism"]["strategy"] = 99;
  EXPECT_NE(refusal(j).find("enum value 99 out of range"), std::string::npos) << refusal(j);
  j = good;
  j["model"].erase("hf_dir");
  EXPECT_NE(refusal(j).find("hf_dir"), std::string::npos) << refusal(j);
  j = good;
  // A float into an int field is converted by static_cast, undefined past
  // int's range: refused before (a fuzzer found this one) ...
  j["model"]["n_layer"] = 1.09951e+125;
  EXPECT_EQ(refusal(j),
            "job-7: job spec: /model/n_layer: not a value of its field's type and range, or no such field");
  j = good;
  j["data"]["train"]["paths"] = nlohmann::json::array({1e300});  // an empty default list types nothing
  EXPECT_EQ(refusal(j),
            "job-7: job spec: /data/train/paths/0: not a value of its field's type and range, or no such field");
  // ... while a double field takes any float: tests force divergence with lr = 1e30.
  j = good;
  j["optimizer"]["lr"] = 1e30;
  EXPECT_EQ(refusal(j), "accepted");
  j = good;
  j["model"]["family"] = 3;
  EXPECT_EQ(refusal(j).rfind("job-7: job spec: ", 0), 0u) << refusal(j);
  for (const char* text : {"", "{", "[]", "null", "\"x\""}) {
    absl::StatusOr<JobConfig> c = DecodeJobConfig(text, "job-7");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().message().rfind("job-7: job spec: ", 0), 0u) << c.status();
    EXPECT_EQ(c.status().message().find('\n'), std::string::npos) << c.status();
  }
  const std::string huge(kMaxJobWireBytes + 1, ' ');
  EXPECT_EQ(DecodeJobConfig(huge, "job-7").status().message(),
            absl::StrCat("job-7: job spec of ", huge.size(), " bytes (at most ", kMaxJobWireBytes, ")"));
}

}  // namespace
}  // namespace shardline
