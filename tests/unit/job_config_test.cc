// JobConfig: every bad input is one line naming the file and key.
#include "common/job/job_config.h"
#include "common/job/job_file.h"
#include "common/model/model_shapes.h"
#include "common/spec/job_spec.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "tests/unit/job_files.h"

namespace shardline {
namespace {

constexpr const char* kGood = test::kHybridJob;

std::string ErrorOf(const std::string& text, int world = 2) {
  auto c = ParseJobConfig(text, "job.toml");
  if (!c.ok()) return std::string(c.status().message());
  absl::Status s = ValidateJobConfig(*c, world, "job.toml");
  return s.ok() ? "" : std::string(s.message());
}

// docs/job-file.md documents every key the parser accepts, and no other:
// its "## [section]" headings and the first cell of each table row.
TEST(JobFileKeys, DocumentedInDocsJobFile) {
  std::ifstream in(std::string(SHARDLINE_SOURCE_DIR) + "/docs/job-file.md");
  ASSERT_TRUE(in) << "docs/job-file.md";
  std::set<std::string> documented;
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.rfind("## [", 0) == 0 && line.back() == ']') section = line.substr(4, line.size() - 5);
    if (!section.empty() && line.rfind("| `", 0) == 0) {
      const size_t end = line.find('`', 3);
      ASSERT_NE(end, std::string::npos) << line;
      EXPECT_TRUE(documented.insert(section + "." + line.substr(3, end - 3)).second) << "twice: " << line;
    }
  }
  std::set<std::string> accepted;
  for (const std::string& k : JobFileKeys()) accepted.insert(k);
  for (const std::string& k : accepted) EXPECT_TRUE(documented.count(k)) << k << " is accepted but not in docs/job-file.md";
  for (const std::string& k : documented) EXPECT_TRUE(accepted.count(k)) << k << " is in docs/job-file.md but not accepted";
  EXPECT_GT(accepted.size(), 70u);  // every section's keys, not an empty list
}

TEST(JobConfig, SavesTheLastStepByDefault) {
  auto c = ParseJobConfig(kGood, "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->checkpoint.at_end);
  auto off = ParseJobConfig(std::string(kGood) + "\n[checkpoint]\nat_end = false\n", "job.toml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->checkpoint.at_end);
}

TEST(JobConfig, ParsesAGoodFile) {
  auto c = ParseJobConfig(kGood, "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->parallelism.strategy, Strategy::kHybridShard);
  EXPECT_EQ(c->precision.param_dtype, DType::kBFloat16);
  EXPECT_EQ(c->prefetch.backward, BackwardPrefetch::kPost);
  EXPECT_EQ(ShardGroupSize(*c, 4), 2);
  EXPECT_TRUE(ValidateJobConfig(*c, 2, "job.toml").ok());
}

// [optimizer] schedule by name; wsd's decay phase must fit after the warmup,
// and decay_steps means nothing to the others.
TEST(JobConfig, ScheduleAndDecayStepsAreCheckedAndNamed) {
  const std::string base = std::string(kGood) + "\n[optimizer]\nwarmup_steps = 2\n";
  auto wsd = ParseJobConfig(base + "schedule = \"wsd\"\ndecay_steps = 3\n", "job.toml");
  ASSERT_TRUE(wsd.ok()) << wsd.status();
  EXPECT_EQ(wsd->optimizer.schedule, LrSchedule::kWsd);
  EXPECT_EQ(wsd->optimizer.decay_steps, 3);
  EXPECT_NE(ErrorOf(base + "schedule = \"step\"\n").find("unknown schedule \"step\" (expected cosine, linear"),
            std::string::npos);
  EXPECT_NE(ErrorOf(base + "schedule = \"wsd\"\n").find("needs decay_steps in [1, steps - warmup_steps"),
            std::string::npos);
  EXPECT_NE(ErrorOf(base + "schedule = \"wsd\"\ndecay_steps = 100000\n").find("not 100000"), std::string::npos);
  EXPECT_NE(ErrorOf(base + "decay_steps = 3\n").find("decay_steps is for schedule = \"wsd\", not \"cosine\""),
            std::string::npos);
}

TEST(JobConfig, MalformedTomlNamesFileAndLine) {
  const std::string e = ErrorOf("[model]\nn_layer = = 3\n");
  EXPECT_NE(e.find("job.toml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("malformed TOML"), std::string::npos) << e;
}

// toml++ 3.3 reaches __builtin_unreachable for some non-ASCII code points
// where it looks for whitespace (tests/fuzz found it; see
// tests/fuzz/CMakeLists.txt). This build must read them as a parse error
// naming the place, never as anything else.
TEST(JobConfig, CodePointsThatTomlPlusPlusMisclassifiesAreAParseError) {
  for (const char* text : {"[model]\nn_layer = 9\xd1\xbc" "9\n",     // U+047C after a value
                           "[model]\nn_layer = 2 \xc3\xa9\n",          // U+00E9 where a comment may start
                           "[model]\nn_layer = 2\n \xe2\xb1\xbe = 3\n",  // U+2C7E where a key may start
                           "\xc2\xa1[model]\n"}) {
    const std::string e = ErrorOf(text);
    EXPECT_NE(e.find("malformed TOML"), std::string::npos) << e;
    EXPECT_NE(e.find("job.toml:"), std::string::npos) << e;
  }
  // Inside strings they are text like any other.
  EXPECT_EQ(ErrorOf(std::string(kGood).replace(std::string(kGood).find("\"gpt\""), 5, "\"mod\xc3\xa8le\"")), "");
}

TEST(JobConfig, AMalformedValueIsQuotedOnOneLine) {
  // toml++ quotes the bytes it saw, here a newline (found by tests/fuzz).
  const std::string e = ErrorOf("[model]\nqk_norm = tr\nn_layer = 2\n");
  EXPECT_NE(e.find("job.toml:2:"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_NE(e.find("saw 'tr\\n'"), std::string::npos) << e;
}

TEST(JobConfig, UnknownKeyAndSectionAreNamed) {
  EXPECT_NE(ErrorOf("[model]\nn_layers = 3\n").find("[model] n_layers: unknown key"), std::string::npos);
  EXPECT_NE(ErrorOf("[modle]\nn_layer = 3\n").find("[modle]: unknown section"), std::string::npos);
}

TEST(JobConfig, WrongTypesAreNamed) {
  EXPECT_NE(ErrorOf("[model]\nn_layer = \"six\"\n").find("[model] n_layer must be an integer"),
            std::string::npos);
  EXPECT_NE(ErrorOf("[optimizer]\nlr = \"fast\"\n").find("[optimizer] lr must be a number"), std::string::npos);
  EXPECT_NE(ErrorOf("[precision]\nallow_tf32 = \"yes\"\n").find("allow_tf32"), std::string::npos);
  EXPECT_NE(ErrorOf("[memory]\nactivation_checkpointing = 1\n").find("activation_checkpointing must be true"),
            std::string::npos);
  EXPECT_NE(ErrorOf("[parallelism]\nstrategy = \"zero4\"\n").find("[parallelism] strategy: unknown strategy"),
            std::string::npos);
}

TEST(JobConfig, ImpossibleValuesAreNamed) {
  std::string bad = kGood;
  bad.replace(bad.find("n_embd = 32"), 11, "n_embd = 30");
  EXPECT_NE(ErrorOf(bad).find("[model] n_embd = 30 is not divisible by n_head = 4"), std::string::npos);
  EXPECT_NE(ErrorOf(kGood, 3).find("[train] batch_size = 8 is not divisible by the world size 3"),
            std::string::npos);
  std::string micro = kGood;
  micro.replace(micro.find("micro_batch_size = 2"), 20, "micro_batch_size = 3");
  EXPECT_NE(ErrorOf(micro).find("micro_batch_size = 3 does not divide the per-rank batch 4"), std::string::npos);
  EXPECT_EQ(ErrorOf(kGood, 4), "");
  std::string group = kGood;
  group.replace(group.find("shard_group_size = 2"), 20, "shard_group_size = 3");
  EXPECT_NE(ErrorOf(group, 4).find("shard_group_size = 3 must divide the world size 4"), std::string::npos);
  // The optimizer across replicas is hybrid_shard's; elsewhere it is named.
  std::string pieces = kGood;
  pieces.replace(pieces.find("shard_group_size = 2"), 20, "shard_optimizer_across_replicas = true");
  EXPECT_EQ(ErrorOf(pieces, 4), "");
  pieces.replace(pieces.find("\"hybrid_shard\""), 14, "\"full_shard\"");
  EXPECT_NE(ErrorOf(pieces, 4).find("[parallelism] shard_optimizer_across_replicas is for strategy = \"hybrid_shard\", "
                                    "not \"full_shard\""),
            std::string::npos)
      << ErrorOf(pieces, 4);
  EXPECT_NE(ErrorOf("[model]\n[data]\nformat = \"llmc\"\n").find("[data] path is required"), std::string::npos);
}

TEST(JobConfig, IntegersAreCheckedBeforeTheyAreNarrowed) {
  // 4294967301 is 5 after a 32-bit truncation, 1099511627840 is 64.
  std::string e = ErrorOf("[model]\n[train]\nsteps = 4294967301\n");
  EXPECT_NE(e.find("[train] steps = 4294967301 is out of range [1, 2147483647]"), std::string::npos) << e;
  e = ErrorOf("[model]\nvocab_size = 1099511627840\n");
  EXPECT_NE(e.find("[model] vocab_size = 1099511627840 is out of range [2, 16777216]"), std::string::npos) << e;
  e = ErrorOf("[model]\nn_layer = 100000000\n");
  EXPECT_NE(e.find("[model] n_layer = 100000000 is out of range [1, 10000]"), std::string::npos) << e;
  e = ErrorOf("[model]\n[train]\nseed = -1\n");
  EXPECT_NE(e.find("[train] seed = -1 is out of range"), std::string::npos) << e;
}

TEST(JobConfig, LogIntervalDefaultsToTenAndIsBounded) {
  auto c = ParseJobConfig(kGood, "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.log_interval, 10);
  c = ParseJobConfig("[model]\n[train]\nlog_interval = 0\n", "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.log_interval, 0);
  const std::string e = ErrorOf("[model]\n[train]\nlog_interval = -1\n");
  EXPECT_NE(e.find("[train] log_interval = -1 is out of range [0, 2147483647]"), std::string::npos) << e;
}

TEST(JobConfig, NumbersMustBeFinite) {
  const std::string e = ErrorOf("[model]\n[optimizer]\nlr = inf\n");
  EXPECT_NE(e.find("[optimizer] lr = inf must be finite"), std::string::npos) << e;
  EXPECT_NE(ErrorOf("[model]\n[optimizer]\neps = nan\n").find("eps = nan must be finite"), std::string::npos);
}

TEST(JobConfig, AnEmptyFileOrOneWithoutAModelIsAnError) {
  EXPECT_NE(ErrorOf("").find("job.toml: no [model] section"), std::string::npos);
  EXPECT_NE(ErrorOf("[train]\nsteps = 3\n").find("no [model] section"), std::string::npos);
}

TEST(JobConfig, LoraTakesPeftsDefaultsAndNamesBadKeys) {
  auto c = ParseJobConfig(std::string(kGood) + "[lora]\n", "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->lora.enabled);
  EXPECT_EQ(c->lora.rank, 8);
  EXPECT_DOUBLE_EQ(c->lora.scaling(), 1.0);
  EXPECT_EQ(model::LoraModules(c->model, c->lora), std::vector<std::string>{"c_attn"});  // PEFT's for GPT-2
  EXPECT_FALSE(ParseJobConfig(kGood, "job.toml")->lora.enabled);
  c = ParseJobConfig(std::string(kGood) + "[lora]\nrank = 4\nalpha = 16\ntarget_modules = \"all-linear\"\n",
                     "job.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->lora.scaling(), 4.0);
  EXPECT_EQ(model::LoraModules(c->model, c->lora), (std::vector<std::string>{"c_attn", "c_proj", "c_fc"}));
  // Both c_proj (attention and MLP) and c_attn, c_fc: four adapters a block.
  EXPECT_EQ(model::LoraTargets(c->model, c->lora, 1).size(), 4u);
  EXPECT_TRUE(model::LoraTargets(c->model, c->lora, 0).empty());  // none on the embedding
  EXPECT_EQ(ErrorOf(std::string(kGood) + "[lora]\nranks = 4\n"), "job.toml: [lora] ranks: unknown key");
  EXPECT_EQ(ErrorOf(std::string(kGood) + "[lora]\nalpha = 0\n"), "job.toml: [lora] alpha must be > 0");
  EXPECT_EQ(ErrorOf(std::string(kGood) + "[lora]\ntarget_modules = [\"q_proj\"]\n"),
            "job.toml: [lora] target_modules: \"q_proj\" is not a projection of family \"gpt2\" (expected "
            "\"all-linear\" or some of c_attn, c_proj, c_fc)");
  EXPECT_EQ(ErrorOf(std::string(kGood) + "[lora]\nbase = \"gpu\"\n"),
            "job.toml: [lora] base: unknown value \"gpu\" (expected sharded or replicated)");
}

// Values, keys and paths are echoed from the job file escaped and cut short:
// a TOML multi-line string or a quoted key holding a newline once broke the
// one-line error (tests/fuzz found it in CI).
TEST(JobConfig, EchoedTextStaysOnOneLine) {
  EXPECT_EQ(ErrorOf("[model]\nn_layer = 2\n[prefetch]\nbackward = \"\"\"\np\"s\n\tq\"\"\"\n"),
            "job.toml: [prefetch] backward: unknown value \"p\\\"s\\n\\tq\" (expected pre, post or none)");
  EXPECT_EQ(ErrorOf("[model]\n\"n_\\nlayer\" = 2\n"), "job.toml: [model] n_\\nlayer: unknown key");
  EXPECT_EQ(ErrorOf("[\"a\\u001b[2J\"]\n"), "job.toml: [a\\x1b[2J]: unknown section");
  const std::string error = ErrorOf(std::string(kGood) + "[lora]\nbase = \"" + std::string(10000, 'x') + "\"\n");
  EXPECT_EQ(error, "job.toml: [lora] base: unknown value \"" + std::string(64, 'x') +
                       "...\" (expected sharded or replicated)");
  EXPECT_EQ(ErrorOf(std::string(kGood).replace(std::string(kGood).find("\"gpt\""), 5, "\"\\u001b[31mgpt\"")),
            "job.toml: [job] name = \"\\x1b[31mgpt\": at most 128 bytes and no control characters");
  EXPECT_EQ(ErrorOf("[model]\nfamily = \"gpt\\u00e9\"\n"), "job.toml: [model] family = \"gpt\\xc3\\xa9\": expected gpt2 or llama");
}

// Paths are shown to every user (status, ckpt list, messages): one that
// would act on a terminal is refused where it enters, naming its key; a path
// in any script is a path.
TEST(JobConfig, APathThatWouldActOnATerminalIsRefused) {
  EXPECT_EQ(ErrorOf(std::string(kGood) + "[checkpoint]\ndir = \"ck\\u001b]0;pwned\\u0007\"\n"),
            "job.toml: [checkpoint] dir = \"ck\\x1b]0;pwned\\x07\": control characters are not allowed in a path");
  EXPECT_EQ(ErrorOf(std::string(kGood) + "[checkpoint]\ndir = \"\"\"\nck\nx\"\"\"\n"),
            "job.toml: [checkpoint] dir = \"ck\\nx\": control characters are not allowed in a path");
  EXPECT_EQ(ErrorOf(std::string(kGood) + "[checkpoint]\ndir = \"ck\\u202e\"\n"),
            "job.toml: [checkpoint] dir = \"ck\\xe2\\x80\\xae\": control characters are not allowed in a path");
  EXPECT_EQ(ErrorOf(std::string(kGood) + "[checkpoint]\ndir = \"/data/数据/ckpt\"\n"), "");
}

TEST(JobConfig, TheParameterCountIsBounded) {
  // Every key within its own bound, the product far beyond any machine.
  const std::string e = ErrorOf("[model]\nn_layer = 10000\nn_embd = 1048576\nn_head = 1\n");
  EXPECT_NE(e.find("[model] the model has 1.32e+17 parameters, more than the limit of 1e+13"), std::string::npos)
      << e;
  // Llama's attention widths (n_head x head_dim = 2^32 rows of n_embd = 2^20)
  // over 10000 layers: about 1.8e20, past int64, where a wrapped count came
  // out negative and passed the bound.
  const std::string llama = ErrorOf(
      "[model]\nfamily = \"llama\"\nn_layer = 10000\nn_head = 65536\nn_embd = 1048576\nhead_dim = 65536\n"
      "intermediate_size = 1\n");
  EXPECT_NE(llama.find("[model] the model has 1.8e+20 parameters, more than the limit of 1e+13"), std::string::npos)
      << llama;
}

// A file key that names a directory says so, rather than "no such file".
TEST(JobConfig, AnInitFromThatIsADirectoryIsNotARegularFile) {
  const std::string dir = ::testing::TempDir();
  JobConfig c;
  c.data.format = DataFormat::kSynthetic;
  c.model.init_from = dir;
  absl::Status s = CheckJobFiles(c, "job.toml");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("init_from: " + dir), std::string::npos) << s;
  EXPECT_NE(s.message().find("not a regular file (a directory)"), std::string::npos) << s;
  c.model.init_from = dir + "/no-such-model.safetensors";
  s = CheckJobFiles(c, "job.toml");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

// config.json and adapter_config.json are read value by value with their
// types checked: a value of another type, or a number no int holds, is an
// error naming the file (tests/fuzz/hf_json found both crashing: nlohmann
// threw out of ResolveJobSpec, and a double was cast to int out of range).
TEST(JobConfig, HuggingFaceJsonOfTheWrongTypeIsAnError) {
  const std::string dir = ::testing::TempDir() + "/hf-json-types";
  ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir + "/hf " + dir + "/adapter").c_str()), 0);
  auto write = [](const std::string& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; };
  write(dir + "/hf/config.json",
        R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 100, "vocab_size": 100,
            "rope_scaling": {"rope_type": "llama3", "original_max_position_embeddings": 1e300}})");
  absl::StatusOr<JobConfig> c = ResolveJobSpec("[model]\nhf_dir = \"hf\"\n", "job.toml", dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            dir + "/hf/config.json: rope original_max_position_embeddings = 1e+300 is not a valid size");

  write(dir + "/hf/config.json", R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64})");
  write(dir + "/adapter/adapter_config.json", R"({"peft_type": 5, "r": 8, "lora_alpha": 16})");
  c = ResolveJobSpec("[model]\nhf_dir = \"hf\"\n[lora]\ninit_from = \"adapter\"\n", "job.toml", dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), dir + "/adapter/adapter_config.json: peft_type: 5 is not LORA (not supported)");
  write(dir + "/adapter/adapter_config.json", R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "bias": [1, 2]})");
  c = ResolveJobSpec("[model]\nhf_dir = \"hf\"\n[lora]\ninit_from = \"adapter\"\n", "job.toml", dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), dir + "/adapter/adapter_config.json: bias: [1,2] (not supported)");
}

// Every path a job file names resolves against its folder in one place
// (ResolveJobSpec), so the coordinator, shardctl and each worker see the
// same files: a relative path becomes base_dir/path, an absolute one is
// kept, and config.json is read from the resolved hf_dir.
TEST(JobConfig, ResolveJobSpecMakesEveryNamedPathAbsolute) {
  const std::string dir = ::testing::TempDir() + "/resolve-paths";
  ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir + "/hf").c_str()), 0);
  std::ofstream(dir + "/hf/config.json")
      << R"({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64})";
  absl::StatusOr<JobConfig> c = ResolveJobSpec(R"(
[model]
hf_dir = "hf"
[data]
path = ["train/*.bin", "/abs/x.bin"]
mask_path = "masks/m.bin"
val_path = "val.bin"
val_mask_path = "vm.bin"
[lora]
rank = 4
[checkpoint]
dir = "ckpt"
)", "job.toml", dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.hf_dir, dir + "/hf");
  EXPECT_EQ(c->model.n_embd, 32);  // config.json was found through the resolved path
  EXPECT_EQ(c->data.train.paths, (std::vector<std::string>{dir + "/train/*.bin", "/abs/x.bin"}));
  EXPECT_EQ(c->data.train.mask_paths, (std::vector<std::string>{dir + "/masks/m.bin"}));
  EXPECT_EQ(c->data.val.paths, (std::vector<std::string>{dir + "/val.bin"}));
  EXPECT_EQ(c->data.val.mask_paths, (std::vector<std::string>{dir + "/vm.bin"}));
  EXPECT_EQ(c->checkpoint.dir, "ckpt");  // placed by the coordinator, under its own rules

  c = ResolveJobSpec("[model]\nn_layer = 1\ninit_from = \"w.safetensors\"\n[lora]\ninit_from = \"a\"\n", "job.toml", dir);
  ASSERT_FALSE(c.ok());  // no adapter there; the error names the resolved folder
  EXPECT_NE(c.status().message().find(dir + "/a"), std::string::npos) << c.status();
  c = ResolveJobSpec("[model]\nn_layer = 1\ninit_from = \"w.safetensors\"\n", "job.toml", dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.init_from, dir + "/w.safetensors");
}

}  // namespace
}  // namespace shardline
