// Fuzzes the job file parser (ParseJobConfig: TOML text -> JobConfig) and the
// validation every program runs after it (ValidateJobConfig). Invariants: an
// error is one line naming the file; a parsed config holds every key within
// the bounds ReadSections documents; a valid one has a model within the
// parameter limit whose trainable ownership map can be built. The same bytes
// as a resolved spec on the wire (DecodeJobConfig, common/job/job_wire.h):
// never a crash, an error in one line naming its source; and every parsed
// config crosses the wire and back unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/job/job_config.h"
#include "common/job/job_file.h"
#include "common/job/job_wire.h"
#include "common/model/model_shapes.h"
#include "common/spec/job_spec.h"
#include "tests/fuzz/fuzz_check.h"

namespace shardline {
namespace {

constexpr char kFile[] = "job.toml";

void CheckBounds(const JobConfig& c) {
  const ModelConfig& m = c.model;
  FUZZ_CHECK(c.workers >= 1 && c.workers <= (1 << 20), "workers %d", c.workers);
  FUZZ_CHECK(m.n_layer >= 1 && m.n_layer <= 10000, "n_layer %d", m.n_layer);
  FUZZ_CHECK(m.n_head >= 1 && m.n_head <= 65536, "n_head %d", m.n_head);
  FUZZ_CHECK(m.n_embd >= 1 && m.n_embd <= (1 << 20), "n_embd %d", m.n_embd);
  FUZZ_CHECK(m.vocab_size >= 2 && m.vocab_size <= (1 << 24), "vocab_size %d", m.vocab_size);
  FUZZ_CHECK(m.block_size >= 1 && m.block_size <= (1 << 20), "block_size %d", m.block_size);
  FUZZ_CHECK(m.n_kv_head >= 0 && m.head_dim_override >= 0 && m.intermediate_size >= 0, "llama sizes");
  FUZZ_CHECK(c.train.steps >= 1 && c.train.batch_size >= 1 && c.train.micro_batch_size >= 1, "train sizes");
  FUZZ_CHECK(c.train.eval_interval >= 0 && c.train.eval_batches >= 1, "eval");
  FUZZ_CHECK(c.parallelism.shard_group_size >= 0, "shard_group_size %d", c.parallelism.shard_group_size);
  FUZZ_CHECK(c.prefetch.max_inflight_all_gathers >= 1 && c.prefetch.max_inflight_all_gathers <= 64, "prefetch");
  FUZZ_CHECK(c.lora.rank >= 1 && c.checkpoint.interval >= 0 && c.checkpoint.keep_latest >= 0, "lora/checkpoint");
}

}  // namespace
}  // namespace shardline

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardline;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<JobConfig> wire = DecodeJobConfig(text, "job-1");
  if (!wire.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(wire.status().message(), "job-1"), "wire error \"%s\"",
               std::string(wire.status().message()).c_str());
  } else {
    FUZZ_CHECK(EncodeJobConfig(*wire) == EncodeJobConfig(*DecodeJobConfig(EncodeJobConfig(*wire), "job-1")),
               "a decoded spec round trips");
  }
  absl::StatusOr<JobConfig> c = ParseJobConfig(text, kFile);
  if (!c.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(c.status().message(), kFile), "error \"%s\"",
               std::string(c.status().message()).c_str());
    return 0;
  }
  CheckBounds(*c);
  const std::string sent = EncodeJobConfig(*c);
  const absl::StatusOr<JobConfig> got = DecodeJobConfig(sent, "job-1");
  FUZZ_CHECK(got.ok() && EncodeJobConfig(*got) == sent, "a parsed config crosses the wire unchanged: %s",
             got.ok() ? "changed" : std::string(got.status().message()).c_str());
  const absl::Status valid = ValidateJobConfig(*c, c->workers, kFile);
  if (!valid.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(valid.message(), kFile), "error \"%s\"", std::string(valid.message()).c_str());
    return 0;
  }
  const int world = c->workers;
  FUZZ_CHECK(c->train.batch_size % world == 0 && (c->train.batch_size / world) % c->train.micro_batch_size == 0,
             "batch %d at world %d, micro %d", c->train.batch_size, world, c->train.micro_batch_size);
  const int group = ShardGroupSize(*c, world);
  FUZZ_CHECK(group >= 1 && world % group == 0, "shard group %d of world %d", group, world);
  const int64_t params = model::NumParams(c->model);
  FUZZ_CHECK(params > 0 && params <= int64_t{10'000'000'000'000}, "a valid model of %lld parameters",
             static_cast<long long>(params));
  // Building the ownership map allocates per unit, not per parameter.
  const auto own = model::TrainableOwnershipMap(c->model, c->lora, group);
  FUZZ_CHECK(own.ok(), "ownership map of a valid job: %s", std::string(own.status().message()).c_str());
  return 0;
}
