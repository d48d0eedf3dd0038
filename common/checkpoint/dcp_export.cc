#include "common/checkpoint/dcp_export.h"

#include <fcntl.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_export.h"
#include "common/checkpoint/dcp_metadata.h"
#include "common/checkpoint/pickle_writer.h"
#include "common/checkpoint/torch_saved_tensor.h"
#include "common/model/model_shapes.h"
#include "common/model/shard_layout.h"

namespace shardline {
namespace {

// Each chunk is built in memory as one torch.save archive: 64 MiB bounds that
// (DCP reads any number of chunks per tensor).
constexpr int64_t kChunkBytes = int64_t{64} << 20;
constexpr char kDataFile[] = "__0_0.distcp";

// The path flatten_state_dict records for `fqn`: dict keys split at the
// dots that separate levels ("optim", "state", <parameter fqn>, "exp_avg").
std::vector<DcpPathPart> Path(std::vector<std::string> keys) {
  std::vector<DcpPathPart> path;
  for (std::string& k : keys) path.push_back({std::move(k), -1});
  return path;
}

// The `.distcp` file as it is written, and the metadata of what it holds.
class DcpWriter {
 public:
  static absl::StatusOr<std::unique_ptr<DcpWriter>> Create(const std::string& dir) {
    std::unique_ptr<DcpWriter> w(new DcpWriter(dir));
    SL_ASSIGN_OR_RETURN(w->dir_fd_, OpenDirectoryNoFollow(AT_FDCWD, dir, dir));
    SL_ASSIGN_OR_RETURN(w->file_, AtomicFileAt::Create(w->dir_fd_.get(), dir, kDataFile));
    return w;
  }

  // A tensor of `shape`, fp32 (or, with `bf16`, bf16: the values must be
  // bf16's), in chunks of whole rows along dimension 0.
  absl::Status Tensor(const std::string& fqn, std::vector<DcpPathPart> path, const std::vector<int64_t>& shape,
                      const float* values, bool bf16 = false) {
    DcpTensorMeta& t = meta_.tensors[fqn];
    t.dtype = bf16 ? "bfloat16" : "float32";
    t.size = shape;
    int64_t row = 1;
    for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
    const int64_t rows = shape.empty() ? 1 : shape[0];  // a scalar is one chunk
    const int64_t per_chunk = std::max<int64_t>(1, kChunkBytes / (bf16 ? 2 : 4) / std::max<int64_t>(row, 1));
    for (int64_t r = 0; r < rows; r += per_chunk) {
      DcpChunk c;
      c.offsets.assign(shape.size(), 0);
      c.sizes = shape;
      if (!shape.empty()) {
        c.offsets[0] = r;
        c.sizes[0] = std::min(per_chunk, rows - r);
      }
      absl::StatusOr<std::string> archive = TorchSaveFloatTensor(c.sizes, values + r * row, bf16);
      if (!archive.ok()) return absl::InvalidArgumentError(absl::StrCat(fqn, ": ", archive.status().message()));
      SL_ASSIGN_OR_RETURN(DcpStorage s, Append(*archive));
      s.fqn = fqn;
      s.chunk_offsets = c.offsets;
      meta_.storage.push_back(std::move(s));
      t.chunks.push_back(std::move(c));
    }
    meta_.planner_data[fqn] = std::move(path);
    ++tensors_;
    return absl::OkStatus();
  }

  // A value (torch.load'ed by DCP's loader) whose pickle is `data_pkl`.
  absl::Status Value(const std::string& fqn, std::vector<DcpPathPart> path, const std::string& data_pkl) {
    SL_ASSIGN_OR_RETURN(DcpStorage s, Append(TorchSaveValue(data_pkl)));
    s.fqn = fqn;
    meta_.storage.push_back(std::move(s));
    meta_.values.push_back(fqn);
    meta_.planner_data[fqn] = std::move(path);
    return absl::OkStatus();
  }

  // Commits the data file, then `.metadata`: a folder without the latter is
  // no checkpoint to DCP, so a crash before it leaves nothing loadable.
  absl::Status Finish() {
    SL_RETURN_IF_ERROR(file_->Commit());
    return WriteFileAtomicallyAt(dir_fd_.get(), dir_, ".metadata", WriteDcpMetadata(meta_));
  }
  int64_t tensors() const { return tensors_; }
  int64_t bytes() const { return offset_; }

 private:
  explicit DcpWriter(std::string dir) : dir_(std::move(dir)) {}

  absl::StatusOr<DcpStorage> Append(const std::string& bytes) {
    SL_RETURN_IF_ERROR(WriteFully(file_->fd(), bytes.data(), bytes.size(), file_->path()));
    DcpStorage s;
    s.relative_path = kDataFile;
    s.offset = offset_;
    s.length = static_cast<int64_t>(bytes.size());
    offset_ += s.length;
    return s;
  }

  std::string dir_;
  UniqueFd dir_fd_;
  std::unique_ptr<AtomicFileAt> file_;
  DcpMetadata meta_;
  int64_t offset_ = 0, tensors_ = 0;
};

std::string PickleOf(double v) { return PickleWriter().Float(v).Finish(); }
std::string PickleOf(bool v) { return PickleWriter().Bool(v).Finish(); }
std::string PickleOfNone() { return PickleWriter().None().Finish(); }

// AdamW's param_groups entries for group `g` holding `params`, as torch
// 2.11's AdamW.state_dict() has them.
absl::Status ParamGroup(DcpWriter& w, int g, double weight_decay, const OptimizerConfig& o,
                        const std::vector<std::string>& params) {
  auto value = [&](const std::string& key, const std::string& pkl) {
    std::vector<DcpPathPart> path = {{"optim", -1}, {"param_groups", -1}, {"", g}, {key, -1}};
    return w.Value(absl::StrCat("optim.param_groups.", g, ".", key), std::move(path), pkl);
  };
  SL_RETURN_IF_ERROR(value("lr", PickleOf(o.lr)));
  SL_RETURN_IF_ERROR(value("betas", PickleWriter().Mark().Float(o.betas[0]).Float(o.betas[1]).Tuple().Finish()));
  SL_RETURN_IF_ERROR(value("eps", PickleOf(o.eps)));
  SL_RETURN_IF_ERROR(value("weight_decay", PickleOf(weight_decay)));
  for (const char* flag : {"amsgrad", "maximize", "capturable", "differentiable"}) {
    SL_RETURN_IF_ERROR(value(flag, PickleOf(false)));
  }
  for (const char* unset : {"foreach", "fused"}) SL_RETURN_IF_ERROR(value(unset, PickleOfNone()));
  SL_RETURN_IF_ERROR(value("decoupled_weight_decay", PickleOf(true)));
  PickleWriter list;
  list.EmptyList().Mark();
  for (const std::string& p : params) list.String(p);
  return value("params", list.Appends().Finish());
}

}  // namespace

absl::StatusOr<DcpExportReport> ExportDcp(const std::string& step_dir, const JobConfig& job,
                                          const std::string& out_dir, bool overwrite) {
  SL_ASSIGN_OR_RETURN(auto ckpt, CheckpointReader::Open(step_dir));
  const CheckpointManifest& man = ckpt->manifest();
  if (man.lora.enabled) {
    return absl::InvalidArgumentError(absl::StrCat(
        step_dir, ": a LoRA checkpoint holds adapters only: export them with --format peft"));
  }
  SL_RETURN_IF_ERROR(CheckSameTraining(man, job, step_dir));
  if (static_cast<int>(man.units.size()) != model::NumUnits(man.model)) {
    return absl::DataLossError(absl::StrCat(step_dir, ": manifest lists ", man.units.size(), " units, the model has ",
                                            model::NumUnits(man.model)));
  }
  SL_RETURN_IF_ERROR(PrepareExportDir(out_dir, overwrite, ExportKind::kDcp));
  SL_ASSIGN_OR_RETURN(auto w, DcpWriter::Create(out_dir));

  std::vector<std::string> decay, no_decay;  // the two param groups, in model order
  std::vector<float> values;
  for (int u = 0; u < model::NumUnits(man.model); ++u) {
    SL_ASSIGN_OR_RETURN(ShardLayout layout,
                        MakeShardLayout(model::UnitName(man.model, u), model::UnitParams(man.model, u), 1));
    // bf16 state (no master) is written as torch holds it on a bf16 model.
    SL_ASSIGN_OR_RETURN(const std::string param_dtype, ckpt->StoredDType(u, "param"));
    SL_ASSIGN_OR_RETURN(const std::string moments_dtype, ckpt->StoredDType(u, "exp_avg"));
    const bool bf16_params = param_dtype == "BF16", bf16_moments = moments_dtype == "BF16";
    for (const ParamSlot& slot : layout.params) {
      const std::string& name = slot.spec.name;
      const int64_t n = slot.spec.numel();
      values.resize(static_cast<size_t>(n));
      SL_RETURN_IF_ERROR(ckpt->Read(u, "param", slot.offset, slot.offset + n, values.data()));
      SL_RETURN_IF_ERROR(
          w->Tensor("model." + name, Path({"model", name}), slot.spec.shape, values.data(), bf16_params));
      // A tied embedding is also the head, which state_dict lists too.
      const bool tied_head = man.model.tied() && (name == "transformer.wte.weight" ||
                                                  name == "model.embed_tokens.weight");
      if (tied_head) {
        SL_RETURN_IF_ERROR(w->Tensor("model.lm_head.weight", Path({"model", "lm_head.weight"}), slot.spec.shape,
                                     values.data(), bf16_params));
      }
      for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
        SL_RETURN_IF_ERROR(ckpt->Read(u, kind, slot.offset, slot.offset + n, values.data()));
        SL_RETURN_IF_ERROR(w->Tensor(absl::StrCat("optim.state.", name, ".", kind),
                                     Path({"optim", "state", name, kind}), slot.spec.shape, values.data(),
                                     bf16_moments));
      }
      const float step = static_cast<float>(man.step);
      SL_RETURN_IF_ERROR(
          w->Tensor(absl::StrCat("optim.state.", name, ".step"), Path({"optim", "state", name, "step"}), {}, &step));
      (slot.spec.decay ? decay : no_decay).push_back(name);
    }
  }
  SL_RETURN_IF_ERROR(ParamGroup(*w, 0, job.optimizer.weight_decay, job.optimizer, decay));
  SL_RETURN_IF_ERROR(ParamGroup(*w, 1, 0.0, job.optimizer, no_decay));
  SL_RETURN_IF_ERROR(w->Finish());
  return DcpExportReport{man.step, w->tensors(), w->bytes()};
}

}  // namespace shardline
