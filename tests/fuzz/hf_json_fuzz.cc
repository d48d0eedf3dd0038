// Fuzzes the readers of Hugging Face JSON files that a job file points at:
// [model] hf_dir's config.json (ApplyHfConfig) and [lora] init_from's
// adapter_config.json (ApplyPeftConfig), both reached through ResolveJobSpec
// as every program reads a job. The first byte of the input picks the file
// ('a': adapter_config.json beside a fixed GPT-2 config.json; anything else:
// config.json), the rest is its text. Invariants: no exception escapes (a
// JSON value of another type than expected is an error, not a throw); an
// error is one line; a job that parses is as ValidateJobConfig leaves it:
// within the parameter limit, with an ownership map that can be built.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/job/job_config.h"
#include "common/model/model_shapes.h"
#include "common/spec/job_spec.h"
#include "tests/fuzz/fuzz_check.h"

namespace shardline {
namespace {

constexpr char kFile[] = "job.toml";

// A GPT-2 config.json as transformers writes it, for the adapter runs.
constexpr char kGpt2Config[] = R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 32,
  "n_layer": 2, "n_head": 4, "vocab_size": 64, "n_positions": 64, "activation_function": "gelu_new"})";

struct Dirs {
  std::string root, hf, adapter;
};

const Dirs& ScratchDirs() {
  static const Dirs dirs = [] {
    char tmpl[] = "/tmp/shardline-hf-fuzz.XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl) != nullptr, "mkdtemp");
    Dirs d{tmpl, std::string(tmpl) + "/hf", std::string(tmpl) + "/adapter"};
    std::filesystem::create_directories(d.hf);
    std::filesystem::create_directories(d.adapter + "/fixed");
    std::ofstream(d.adapter + "/fixed/config.json", std::ios::trunc) << kGpt2Config;
    // libFuzzer ends the process with exit(): the directory goes with it
    // (a copy of its name that no static destructor frees first).
    static const std::string* const root = new std::string(d.root);
    std::atexit([] { std::filesystem::remove_all(*root); });
    return d;
  }();
  return dirs;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  FUZZ_CHECK(out.good(), "writing %s", path.c_str());
}

}  // namespace
}  // namespace shardline

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardline;
  if (size == 0) return 0;
  const Dirs& d = ScratchDirs();
  const bool adapter = data[0] == 'a';
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string toml;
  if (adapter) {
    Write(d.adapter + "/adapter_config.json", text);
    toml = "[model]\nhf_dir = \"" + d.adapter + "/fixed\"\n[lora]\ninit_from = \"" + d.adapter + "\"\n";
  } else {
    Write(d.hf + "/config.json", text);
    toml = "[model]\nhf_dir = \"" + d.hf + "\"\n";
  }
  absl::StatusOr<JobConfig> c = ResolveJobSpec(toml, kFile, "");
  if (!c.ok()) {
    const absl::string_view msg = c.status().message();
    FUZZ_CHECK(fuzz::NamesFileInOneLine(msg, kFile) || fuzz::NamesFileInOneLine(msg, d.root), "error \"%s\"",
               std::string(msg).c_str());
    return 0;
  }
  c->train.batch_size = c->train.micro_batch_size = 1;
  const absl::Status valid = ValidateJobConfig(*c, 1, kFile);
  if (!valid.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(valid.message(), kFile), "error \"%s\"", std::string(valid.message()).c_str());
    return 0;
  }
  const int64_t params = model::NumParams(c->model);
  FUZZ_CHECK(params > 0 && params <= int64_t{10'000'000'000'000}, "a valid model of %lld parameters",
             static_cast<long long>(params));
  const auto own = model::TrainableOwnershipMap(c->model, c->lora, 1);
  FUZZ_CHECK(own.ok(), "ownership map of a valid job: %s", std::string(own.status().message()).c_str());
  return 0;
}
