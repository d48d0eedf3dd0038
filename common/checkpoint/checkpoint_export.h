// Reading a committed checkpoint by unit, and exporting it as one model file.
//
// CheckpointReader serves any element range of a unit's flat parameters or
// Adam moments, reading only the pieces of the ranks' shard files that
// overlap it; each file is verified against the manifest's SHA-256 the first
// time it is opened (a mismatch is an error naming the file).
//
// ExportModel writes the full model as one safetensors file with the
// engine's names (nanoGPT's for gpt2), a tied embedding under both
// `transformer.wte.weight` and `lm_head.weight`. ExportHf writes a directory
// that transformers' from_pretrained loads: config.json, the weights in
// transformers' names and layouts (common/model/hf_config.h), split into
// model-0000i-of-0000N.safetensors files of at most max_shard_bytes each
// (a single tensor larger than that gets a file of its own) with
// model.safetensors.index.json, or one model.safetensors. Both work one unit
// at a time: no step holds more than one unit in memory.
//
// A LoRA checkpoint holds adapters only: ExportPeft writes them as a PEFT
// adapter directory (adapter_config.json, adapter_model.safetensors) and
// ExportHf with `merge` writes the base (read from the [model] hf_dir or
// init_from the manifest records) with the adapters merged in; the other
// exports refuse it.
//
// An hf or peft export leaves its own files only: its folder is created if
// missing (parents too, never through a symlink) and must be empty, since
// weights an earlier export left there would be loaded in place of its own.
// With `overwrite` the files a loader reads (weights, indexes, config.json,
// adapter_config.json, generation_config.json) are removed first and any
// other file is kept. ExportModel replaces its one file atomically.
//
// So that the exported model generates as its source did, ExportHf's
// config.json declares the source config.json's bos, eos and pad token ids
// (the manifest records them), and the tokenizer and generation settings
// (kTokenizerFiles: tokenizer.json, tokenizer_config.json, ...,
// generation_config.json) are copied beside the weights from `tokenizer_dir`,
// or where that is empty from the model directory the job started from (the
// manifest's [model] hf_dir, a LoRA job's base), if it is still there.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/model/safetensors.h"

namespace shardline {

class CheckpointReader {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& step_dir);
  const CheckpointManifest& manifest() const { return manifest_; }
  // Elements [lo, hi) of unit `unit`'s flat `kind` ("param", "exp_avg" or
  // "exp_avg_sq") into dst; hi must not exceed the unit's numel.
  absl::Status Read(int unit, const std::string& kind, int64_t lo, int64_t hi, float* dst);
  // Tensor "<unit>.<name>" of rank `rank`'s file whole, as raw bytes of
  // `dtype` (SafetensorsReader::ReadRaw): what a state saved beside its
  // values (8-bit moments' codes) for a resume over the same shards.
  absl::Status ReadRankTensor(int rank, int unit, const std::string& name, const std::string& dtype,
                              std::string* out);
  // The safetensors dtype ("F32", "BF16") the checkpoint stores unit
  // `unit`'s `kind` in (its first rank's file).
  absl::StatusOr<std::string> StoredDType(int unit, const std::string& kind);

 private:
  absl::StatusOr<const SafetensorsReader*> RankFile(int rank);
  std::string dir_;
  CheckpointManifest manifest_;
  std::map<int, std::unique_ptr<SafetensorsReader>> files_;
};

absl::Status ExportModel(const std::string& step_dir, const std::string& out_path);

// The files of a tokenizer and of generation settings that transformers'
// save_pretrained writes beside a model.
inline constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json",          "merges.txt",            "added_tokens.json",       "chat_template.jinja",
    "chat_template.json",  "generation_config.json"};

struct HfExportOptions {
  StoredDType dtype = StoredDType::kF32;
  int64_t max_shard_bytes = int64_t{5} << 30;  // transformers' default, 5 GB
  bool merge = false;                           // LoRA: base + adapters
  bool overwrite = false;                       // see below
  std::string tokenizer_dir;                    // empty: the source model directory
};
// What an hf export wrote besides the weights: the tokenizer files it copied
// and from where (empty with nothing copied), or why none were.
struct HfExportReport {
  std::vector<std::string> copied;
  std::string tokenizer_from;
  std::string no_tokenizer;  // set where nothing was copied: why
};
// A `tokenizer_dir` that is given but holds none of kTokenizerFiles is an
// error naming it; a source directory that is gone is only reported.
absl::StatusOr<HfExportReport> ExportHf(const std::string& step_dir, const std::string& out_dir,
                                        const HfExportOptions& options);

absl::Status ExportPeft(const std::string& step_dir, const std::string& out_dir, StoredDType dtype,
                        bool overwrite = false);

// What an export writes, and so what its --overwrite may remove.
enum class ExportKind {
  kHf,    // model.safetensors or model-NNNNN-of-NNNNN.safetensors and its index, config.json, tokenizer files
  kPeft,  // adapter_model.safetensors, adapter_config.json
  kDcp,   // .metadata, __0_0.distcp
};
// Whether an export of `kind` writes a file named `name`.
bool WrittenByExport(ExportKind kind, absl::string_view name);

// An export's folder, created if missing (parents too), never through a
// symlink. One with files is refused unless `overwrite`, which removes the
// files this export would write (WrittenByExport) and nothing else. Every
// refusal is decided before anything is removed: a file of that name that is
// not a regular file (a folder named model.safetensors, a link), or a file
// a loader would read beside the export that it would not write (another
// tool's weights, a DCP checkpoint in an hf folder): it would be loaded in
// place of, or beside, these weights, and it is not ours to delete.
absl::Status PrepareExportDir(const std::string& out_dir, bool overwrite, ExportKind kind);

}  // namespace shardline
