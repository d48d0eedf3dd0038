// WeightSource: the initial values of a model's parameters, read from files
// by the engine's parameter names and layouts, any element range at a time.
//
//   [model] init_from  one safetensors file with the engine's names (a
//                      nanoGPT-format export); a tied token embedding may be
//                      stored as lm_head.weight instead.
//   [model] hf_dir     a transformers directory: model.safetensors, or the
//                      shards listed by model.safetensors.index.json; F32,
//                      BF16 or F16. GPT-2's Conv1D weights are transposed on
//                      the way in and its position table cut to block_size
//                      rows; its names may lack the "transformer." prefix
//                      (GPT2Model files).
//   [lora] init_from   a PEFT adapter directory: adapter_model.safetensors,
//                      serving the adapter parameters (model::AdapterParams)
//                      under PEFT's names (common/model/lora_adapter.h).
//
// A range of a parameter stored as the engine lays it out is one pread; a
// transposed one is read whole and the range picked from it.
//
// Threading: const methods may run on several threads at once (pread).
// Errors name the file and the tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job/job_config.h"
#include "common/model/safetensors.h"
#include "common/model/shard_layout.h"

namespace shardline {

class WeightSource {
 public:
  // The source `m` names (paths already resolved), or nullptr when it names
  // none. Opens every file and reads its header; an index naming a missing
  // file or a tensor its file lacks is an error.
  static absl::StatusOr<std::unique_ptr<WeightSource>> Open(const ModelConfig& m);
  // The adapters of [lora] init_from (path resolved), or nullptr without it.
  static absl::StatusOr<std::unique_ptr<WeightSource>> OpenAdapters(const ModelConfig& m, const LoraConfig& l);

  // The hex SHA-256 of each file's name and SafetensorsReader::Fingerprint:
  // what a LoRA checkpoint records of its frozen base (LoraConfig::
  // base_digest), so that a different base later found at the same path is
  // refused rather than merged or resumed onto. Reads the headers and 64
  // blocks of 4 KiB per file, never the weights whole.
  absl::StatusOr<std::string> Digest() const;

  // Every parameter of the model (of the adapters, for OpenAdapters) is
  // present with its shape and a float dtype.
  absl::Status Check() const;
  // Elements [first, first + count) of parameter `p`, flattened in the
  // engine's layout, into dst as fp32.
  absl::Status Read(const ParamSpec& p, int64_t first, int64_t count, float* dst) const;

 private:
  struct Located {
    const SafetensorsReader* file = nullptr;
    std::string name;         // the tensor's name in that file
    bool transposed = false;  // stored [in, out] (GPT-2 Conv1D)
  };
  WeightSource(ModelConfig m, std::string key, std::string path)
      : m_(std::move(m)), key_(std::move(key)), path_(std::move(path)) {}
  absl::Status AddFile(const std::string& path);
  absl::StatusOr<Located> Locate(const ParamSpec& p) const;
  absl::Status CheckShape(const ParamSpec& p, const Located& at) const;

  ModelConfig m_;
  std::string key_;   // "[model] init_from", "[model] hf_dir" or "[lora] init_from", for errors
  std::string path_;  // what that key names
  LoraConfig lora_;   // enabled for an adapter source
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, const SafetensorsReader*> tensors_;  // name -> the file holding it
};

// WeightSource::Open(m)->Digest(), or "" when `m` names no weight files
// (the base is the engine's seeded initialisation).
absl::StatusOr<std::string> BaseWeightsDigest(const ModelConfig& m);

// Writes elements [begin, begin + count) of a unit's flat fp32 buffer (the
// layout's order, its padding zero) from `w` into `dst`.
absl::Status ReadUnitRange(const WeightSource& w, const ShardLayout& layout, int64_t begin, int64_t count,
                           float* dst);

}  // namespace shardline
