#include "common/checkpoint/dcp_import.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/checkpoint/dcp_metadata.h"
#include "common/checkpoint/torch_saved_tensor.h"
#include "common/model/model_shapes.h"
#include "common/model/safetensors.h"

namespace shardline {
namespace {

// A `.metadata` larger than this is not one DCP writes for any model here
// (a 70B model with AdamW at 1024 ranks writes ~50 MB).
constexpr int64_t kMaxMetadataBytes = int64_t{256} << 20;
// Steps from the file are held to the range the flags take.
constexpr int64_t kMaxStep = int64_t{1} << 40;

// The DCP directory: its metadata and the chunks of each tensor, read by range.
class DcpSource {
 public:
  static absl::StatusOr<std::unique_ptr<DcpSource>> Open(const std::string& dir) {
    std::unique_ptr<DcpSource> s(new DcpSource(dir));
    const std::string path = dir + "/.metadata";
    SL_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFileNoFollow(path));
    // Refused past the bound before anything is read (its fstat), or as soon as it is passed.
    SL_ASSIGN_OR_RETURN(std::string text, ReadOpenFileToString(fd.get(), path, kMaxMetadataBytes));
    SL_ASSIGN_OR_RETURN(s->meta_, ParseDcpMetadata(text, path));
    for (const DcpStorage& st : s->meta_.storage) s->where_[{st.fqn, st.chunk_offsets}] = &st;
    return s;
  }

  bool Has(const std::string& fqn) const { return meta_.tensors.count(fqn) > 0; }

  // The int entry `fqn` holds (a pickled int, or a one-element tensor), or
  // nullopt where the checkpoint has no such entry.
  absl::StatusOr<std::optional<int64_t>> Int(const std::string& fqn) {
    for (const DcpStorage& s : meta_.storage) {
      if (s.fqn != fqn) continue;
      SL_ASSIGN_OR_RETURN(int fd, File(s.relative_path));
      SL_ASSIGN_OR_RETURN(int64_t v, ReadTorchSavedInt(fd, dir_ + "/" + s.relative_path, s.offset, s.length));
      return std::optional<int64_t>(v);
    }
    return std::optional<int64_t>();
  }
  const std::map<std::string, DcpTensorMeta>& tensors() const { return meta_.tensors; }
  int64_t tensors_read() const { return tensors_read_; }
  int64_t bytes_read() const { return bytes_read_; }

  // The whole tensor `fqn`, which must have `shape` (empty: a scalar), into
  // out as fp32, from the chunks that tile it.
  absl::Status Read(const std::string& fqn, const std::vector<int64_t>& shape, std::vector<float>* out) {
    auto it = meta_.tensors.find(fqn);
    if (it == meta_.tensors.end()) return Bad(absl::StrCat("no tensor ", Shown(fqn, 200)));
    const DcpTensorMeta& t = it->second;
    if (t.dtype != "float32" && t.dtype != "bfloat16" && t.dtype != "float16" && t.dtype != "float64") {
      return Bad(absl::StrCat(Shown(fqn, 200), " is ", t.dtype, ", not a float tensor"));
    }
    if (t.size != shape) {
      return Bad(absl::StrCat(Shown(fqn, 200), " has shape [", absl::StrJoin(t.size, ", "), "], the job's model [",
                              absl::StrJoin(shape, ", "), "]"));
    }
    SL_RETURN_IF_ERROR(CheckTiling(fqn, t));
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    out->assign(static_cast<size_t>(numel), 0.0f);
    for (const DcpChunk& c : t.chunks) SL_RETURN_IF_ERROR(ReadChunk(fqn, t, c, out->data()));
    ++tensors_read_;
    return absl::OkStatus();
  }

  absl::Status Bad(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(dir_, "/.metadata: ", what));
  }

 private:
  explicit DcpSource(std::string dir) : dir_(std::move(dir)) {}

  // Chunks inside the tensor (ParseDcpMetadata checked), none empty, that
  // together hold every element once. The common layout, whole rows along
  // dimension 0 (FSDP2's Shard(0)), is checked as sorted intervals; any other
  // as pairwise disjoint boxes whose volumes sum to the tensor's, for at most
  // kMaxBoxChunks chunks (the pairs are quadratic).
  absl::Status CheckTiling(const std::string& fqn, const DcpTensorMeta& t) const {
    constexpr size_t kMaxBoxChunks = 4096;
    int64_t numel = 1, covered = 0;
    for (int64_t d : t.size) numel *= d;
    bool rows = !t.size.empty();
    std::vector<int64_t> volume;
    for (const DcpChunk& c : t.chunks) {
      volume.push_back(1);
      for (int64_t d : c.sizes) volume.back() *= d;
      if (volume.back() == 0 && numel > 0) return Bad(absl::StrCat(Shown(fqn, 200), ": an empty chunk"));
      covered += volume.back();
      if (covered > numel) break;
      for (size_t d = 1; d < t.size.size(); ++d) rows = rows && c.offsets[d] == 0 && c.sizes[d] == t.size[d];
    }
    if (covered != numel) {
      return Bad(absl::StrCat(Shown(fqn, 200), ": its chunks hold ", covered > numel ? "more than" : "", " ", covered,
                              " of its ", numel, " elements"));
    }
    if (rows) {
      std::vector<std::pair<int64_t, int64_t>> spans;  // [begin, end) along dimension 0
      for (const DcpChunk& c : t.chunks) spans.push_back({c.offsets[0], c.offsets[0] + c.sizes[0]});
      std::sort(spans.begin(), spans.end());
      for (size_t k = 1; k < spans.size(); ++k) {
        if (spans[k].first < spans[k - 1].second) {
          return Bad(absl::StrCat(Shown(fqn, 200), ": chunks overlap at row ", spans[k].first));
        }
      }
      return absl::OkStatus();
    }
    if (t.chunks.size() > kMaxBoxChunks) {
      return Bad(absl::StrCat(Shown(fqn, 200), ": ", t.chunks.size(), " chunks that are not whole rows (at most ",
                              kMaxBoxChunks, ")"));
    }
    for (size_t a = 0; a < t.chunks.size(); ++a) {
      for (size_t b = 0; b < a; ++b) {
        const DcpChunk &x = t.chunks[a], &y = t.chunks[b];
        bool overlap = true;
        for (size_t d = 0; d < t.size.size(); ++d) {
          overlap = overlap && x.offsets[d] < y.offsets[d] + y.sizes[d] && y.offsets[d] < x.offsets[d] + x.sizes[d];
        }
        if (overlap) return Bad(absl::StrCat(Shown(fqn, 200), ": chunks ", b, " and ", a, " overlap"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int> File(const std::string& relative) {
    auto it = fds_.find(relative);
    if (it != fds_.end()) return it->second.get();
    SL_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFileNoFollow(dir_ + "/" + relative));
    const int raw = fd.get();
    fds_.emplace(relative, std::move(fd));
    return raw;
  }

  // Chunk `c` of tensor `t` into `full` (the whole tensor, row-major): one
  // read per run of elements that is contiguous in both.
  absl::Status ReadChunk(const std::string& fqn, const DcpTensorMeta& t, const DcpChunk& c, float* full) {
    auto where = where_.find({fqn, c.offsets});
    if (where == where_.end()) {
      return Bad(absl::StrCat(Shown(fqn, 200), ": no storage_data entry for the chunk at [",
                              absl::StrJoin(c.offsets, ", "), "]"));
    }
    const DcpStorage& s = *where->second;
    const std::string path = dir_ + "/" + s.relative_path;
    SL_ASSIGN_OR_RETURN(int fd, File(s.relative_path));
    SL_ASSIGN_OR_RETURN(TorchSavedTensor saved, ReadTorchSavedTensor(fd, path, s.offset, s.length));
    if (saved.shape != c.sizes || saved.dtype != t.dtype) {
      return absl::DataLossError(absl::StrCat(path, " bytes [", s.offset, ", ", s.offset + s.length, "): ",
                                              Shown(fqn, 200), " chunk of ", saved.dtype, " [",
                                              absl::StrJoin(saved.shape, ", "), "], .metadata says ", t.dtype, " [",
                                              absl::StrJoin(c.sizes, ", "), "]"));
    }
    const size_t rank = t.size.size();
    if (saved.numel == 0) return absl::OkStatus();
    // The innermost dimensions the chunk spans whole, plus the next one, are
    // contiguous in the full tensor: a run.
    size_t split = rank;
    int64_t run = 1;
    while (split > 0) {
      run *= c.sizes[split - 1];
      --split;
      if (c.sizes[split] != t.size[split]) break;
    }
    std::vector<int64_t> idx(split, 0);  // position in the chunk's outer dimensions
    for (int64_t first = 0; first < saved.numel; first += run) {
      int64_t at = 0;  // the run's first element in the full tensor
      for (size_t d = 0; d < rank; ++d) {
        at = at * t.size[d] + c.offsets[d] + (d < split ? idx[d] : 0);
      }
      SL_RETURN_IF_ERROR(ReadTorchSavedFloats(fd, path, saved, first, run, full + at));
      for (size_t d = split; d-- > 0;) {
        if (++idx[d] < c.sizes[d]) break;
        idx[d] = 0;
      }
    }
    bytes_read_ += saved.numel * saved.element_bytes;
    return absl::OkStatus();
  }

  std::string dir_;
  DcpMetadata meta_;
  std::map<std::pair<std::string, std::vector<int64_t>>, const DcpStorage*> where_;
  std::map<std::string, UniqueFd> fds_;
  int64_t tensors_read_ = 0, bytes_read_ = 0;
};

// torchtitan's Llama name of an engine (transformers) name, or "" for none.
std::string TorchtitanName(const std::string& name) {
  static const std::pair<const char*, const char*> kWhole[] = {
      {"model.embed_tokens.weight", "tok_embeddings.weight"},
      {"model.norm.weight", "norm.weight"},
      {"lm_head.weight", "output.weight"}};
  static const std::pair<const char*, const char*> kInLayer[] = {
      {"self_attn.q_proj.weight", "attention.wq.weight"},   {"self_attn.k_proj.weight", "attention.wk.weight"},
      {"self_attn.v_proj.weight", "attention.wv.weight"},   {"self_attn.o_proj.weight", "attention.wo.weight"},
      {"mlp.gate_proj.weight", "feed_forward.w1.weight"},   {"mlp.down_proj.weight", "feed_forward.w2.weight"},
      {"mlp.up_proj.weight", "feed_forward.w3.weight"},     {"input_layernorm.weight", "attention_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"}};
  for (const auto& [engine, titan] : kWhole) {
    if (name == engine) return titan;
  }
  if (!absl::StartsWith(name, "model.layers.")) return "";
  const size_t dot = name.find('.', 13);
  if (dot == std::string::npos) return "";
  const std::string layer = name.substr(13, dot - 13), rest = name.substr(dot + 1);
  for (const auto& [engine, titan] : kInLayer) {
    if (rest == engine) return absl::StrCat("layers.", layer, ".", titan);
  }
  return "";
}

// Rows of a q or k projection ([heads * head_dim, in]) from torchtitan's
// interleaved RoPE pairs (2i, 2i+1) to transformers' halves (i, i + D/2):
// transformers' convert_llama_weights_to_hf permute(), applied to values and
// Adam's moments alike (both are elementwise per weight).
void PermuteRopeRows(int64_t heads, int64_t head_dim, int64_t in, std::vector<float>* w) {
  std::vector<float> out(w->size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < head_dim; ++j) {
      const int64_t from = h * head_dim + 2 * (j % half) + (j >= half ? 1 : 0);
      std::copy_n(w->data() + from * in, in, out.data() + (h * head_dim + j) * in);
    }
  }
  w->swap(out);
}

// Where the job's parameters are in the checkpoint.
struct Naming {
  std::string table;         // "engine" or "torchtitan"
  std::string model_prefix;  // before each model name: "model." or ""
  std::string optim_prefix;  // before each optimizer entry; "" for none found

  std::string Name(const std::string& engine) const {
    return table == "torchtitan" ? TorchtitanName(engine) : engine;
  }
};

absl::StatusOr<Naming> FindNaming(const DcpSource& src, const ModelConfig& m, const std::string& probe,
                                  bool model_only) {
  std::vector<std::string> tables = {"engine"};
  // torchtitan's Llama has neither q/k/v biases nor per-head q/k norms.
  if (m.is_llama() && !m.qkv_bias && !m.qk_norm) tables.push_back("torchtitan");
  std::vector<std::string> tried;
  for (const std::string& table : tables) {
    for (const char* prefix : {"model.", ""}) {
      Naming n{table, prefix, ""};
      tried.push_back(absl::StrCat(prefix, n.Name(probe)));
      if (!src.Has(tried.back())) continue;
      for (const char* optim : {"optim.state.", "optimizer.state."}) {
        if (src.Has(absl::StrCat(optim, n.Name(probe), ".exp_avg"))) n.optim_prefix = optim;
      }
      if (n.optim_prefix.empty() && !model_only) {
        return src.Bad(absl::StrCat("no AdamW state for ", n.Name(probe), " (optim.state.", n.Name(probe),
                                    ".exp_avg or optimizer.state.", n.Name(probe),
                                    ".exp_avg); import the weights alone with --model-only"));
      }
      return n;
    }
  }
  return src.Bad(absl::StrCat("holds none of ", absl::StrJoin(tried, ", "),
                              ": not a checkpoint of this job's model (names: engine/transformers or torchtitan)"));
}

// A model tensor of the checkpoint (under the model prefix, not optimizer
// state, not a scalar) that the job's model lacks is an error naming it: a checkpoint of a
// deeper or wider model must not be cut down silently. A tied model's head may
// be stored beside the embedding, as transformers' state_dict does.
absl::Status CheckNoExtraTensors(const DcpSource& src, const Naming& n, const ModelConfig& m,
                                 const std::vector<ShardLayout>& layouts) {
  std::set<std::string> expected;
  for (const ShardLayout& l : layouts) {
    for (const ParamSlot& p : l.params) expected.insert(n.model_prefix + n.Name(p.spec.name));
  }
  if (m.tied()) expected.insert(n.model_prefix + n.Name("lm_head.weight"));
  for (const auto& [fqn, t] : src.tensors()) {
    // Scalars are a trainer's counters (torchtitan's train_state.step), not weights.
    if (!absl::StartsWith(fqn, n.model_prefix) || absl::StartsWith(fqn, "optim.") ||
        absl::StartsWith(fqn, "optimizer.") || t.size.empty() || expected.count(fqn)) {
      continue;
    }
    return src.Bad(absl::StrCat(Shown(fqn, 200), ": a tensor the job's model lacks (", layouts.size(),
                                " units of ", expected.size(), " tensors)"));
  }
  return absl::OkStatus();
}

// One unit's flat parameter and moments at world size 1.
struct UnitState {
  std::vector<float> param, exp_avg, exp_avg_sq;
};

class Importer {
 public:
  Importer(DcpSource* src, Naming naming, const ModelConfig& m) : src_(src), naming_(std::move(naming)), m_(m) {}

  absl::Status ReadUnit(const ShardLayout& layout, UnitState* u) {
    for (std::vector<float>* v : {&u->param, &u->exp_avg, &u->exp_avg_sq}) v->assign(layout.padded_numel, 0.0f);
    std::vector<float> t;
    for (const ParamSlot& slot : layout.params) {
      const std::string name = naming_.Name(slot.spec.name);
      if (name.empty()) return src_->Bad(absl::StrCat("no ", naming_.table, " name for ", slot.spec.name));
      SL_RETURN_IF_ERROR(ReadInto(naming_.model_prefix + name, slot, &t, u->param.data()));
      if (naming_.optim_prefix.empty()) continue;
      const std::string optim = naming_.optim_prefix + name;
      SL_RETURN_IF_ERROR(ReadInto(optim + ".exp_avg", slot, &t, u->exp_avg.data()));
      SL_RETURN_IF_ERROR(ReadInto(optim + ".exp_avg_sq", slot, &t, u->exp_avg_sq.data()));
      SL_RETURN_IF_ERROR(src_->Read(optim + ".step", {}, &t));
      // Whole and in range before any cast (NaN and 1e30 are a file's too).
      if (!(t[0] >= 0 && t[0] <= static_cast<float>(kMaxStep)) || t[0] != std::floor(t[0])) {
        return src_->Bad(absl::StrCat(optim, ".step is ", t[0], ", not a step"));
      }
      if (step_ < 0) {
        step_ = static_cast<int64_t>(t[0]);
        step_from_ = optim + ".step";
      }
      if (static_cast<int64_t>(t[0]) != step_) {
        return src_->Bad(absl::StrCat(optim, ".step is ", t[0], ", ", step_from_, " is ", step_));
      }
    }
    return absl::OkStatus();
  }
  int64_t step() const { return std::max<int64_t>(step_, 0); }

 private:
  absl::Status ReadInto(const std::string& fqn, const ParamSlot& slot, std::vector<float>* t, float* flat) {
    SL_RETURN_IF_ERROR(src_->Read(fqn, slot.spec.shape, t));
    const bool rope_rows = naming_.table == "torchtitan" && (absl::EndsWith(slot.spec.name, "q_proj.weight") ||
                                                             absl::EndsWith(slot.spec.name, "k_proj.weight"));
    if (rope_rows) {
      const int64_t heads = absl::EndsWith(slot.spec.name, "q_proj.weight") ? m_.n_head : m_.kv_heads();
      PermuteRopeRows(heads, m_.head_dim(), slot.spec.shape[1], t);
    }
    std::copy(t->begin(), t->end(), flat + slot.offset);
    return absl::OkStatus();
  }

  DcpSource* src_;
  Naming naming_;
  const ModelConfig& m_;
  int64_t step_ = -1;
  std::string step_from_;
};

// What a job could resume from: every weight and moment finite, and Adam's
// second moment (a mean of squares) never negative. A checkpoint past that
// would be committed only to fail the job later ("training diverged").
absl::Status CheckTrainable(const std::string& unit, const UnitState& u) {
  const std::pair<const char*, const std::vector<float>*> parts[] = {
      {"a weight", &u.param}, {"exp_avg", &u.exp_avg}, {"exp_avg_sq", &u.exp_avg_sq}};
  for (const auto& [what, v] : parts) {
    for (size_t i = 0; i < v->size(); ++i) {
      const float x = (*v)[i];
      if (!std::isfinite(x) || (v == &u.exp_avg_sq && x < 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unit ", unit, ": ", what, " is ", x, " at element ", i,
            std::isfinite(x) ? " (a second moment is never negative)" : "", ": not a checkpoint to train from; refused"));
      }
    }
  }
  return absl::OkStatus();
}

// The rank file of the one-rank checkpoint, written unit by unit.
absl::StatusOr<ManifestRankFile> WriteUnits(const std::string& step_dir, const std::vector<ShardLayout>& layouts,
                                            Importer* importer) {
  std::vector<SafetensorsStreamWriter::Decl> decls;
  for (const ShardLayout& l : layouts) {
    for (const char* kind : {".param", ".exp_avg", ".exp_avg_sq"}) decls.push_back({l.unit + kind, {l.padded_numel}});
  }
  ManifestRankFile f;
  f.rank = 0;
  f.file = RankFileName(0);
  const std::string path = step_dir + "/" + f.file;
  SL_ASSIGN_OR_RETURN(auto writer, SafetensorsStreamWriter::Create(path, decls));
  UnitState u;
  for (const ShardLayout& l : layouts) {
    SL_RETURN_IF_ERROR(importer->ReadUnit(l, &u));
    SL_RETURN_IF_ERROR(CheckTrainable(l.unit, u));
    for (const std::vector<float>* v : {&u.param, &u.exp_avg, &u.exp_avg_sq}) {
      SL_RETURN_IF_ERROR(writer->Append(v->data(), static_cast<int64_t>(v->size())));
    }
  }
  SL_RETURN_IF_ERROR(writer->Finish());
  SL_RETURN_IF_ERROR(DescribeWrittenRankFile(path, &f));
  return f;
}

}  // namespace

absl::StatusOr<DcpImportReport> ImportDcp(const std::string& dcp_dir, const JobConfig& job,
                                          const std::string& checkpoint_root, const DcpImportOptions& options) {
  if (job.lora.enabled) {
    return absl::InvalidArgumentError(absl::StrCat(job.name, ": a [lora] job's checkpoints hold adapters only; start "
                                                   "it from the base with [model] hf_dir, not from a DCP checkpoint"));
  }
  SL_ASSIGN_OR_RETURN(auto src, DcpSource::Open(dcp_dir));
  SL_ASSIGN_OR_RETURN(std::vector<ShardLayout> layouts, model::TrainableOwnershipMap(job.model, job.lora, 1));
  SL_ASSIGN_OR_RETURN(Naming naming,
                      FindNaming(*src, job.model, layouts.front().params.front().spec.name, options.model_only));
  SL_RETURN_IF_ERROR(CheckNoExtraTensors(*src, naming, job.model, layouts));
  Importer importer(src.get(), naming, job.model);

  // Every refusal is decided before the first write: the root and the step
  // folder are real folders (never links), the step is not committed, the
  // data position is known. The units are written into a folder of this
  // import's own and moved into step-N through open folders, so that a link
  // swapped in after the checks is not followed either.
  auto refuse_step = [&](int64_t step) -> absl::Status {
    const std::string dir = absl::StrCat(checkpoint_root, "/", StepDirName(step));
    struct stat st;
    if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      return absl::PermissionDeniedError(
          absl::StrCat(Shown(dir, 256), S_ISLNK(st.st_mode) ? ": is a symlink: refused" : ": not a folder: refused"));
    }
    if (ReadManifest(dir).ok()) {
      return absl::AlreadyExistsError(absl::StrCat(Shown(dir, 256), ": a committed checkpoint is already there"));
    }
    return absl::OkStatus();
  };
  struct stat root_st;
  std::string root_name = checkpoint_root;  // "link/" would be followed: lstat the name itself
  while (root_name.size() > 1 && root_name.back() == '/') root_name.pop_back();
  if (::lstat(root_name.c_str(), &root_st) == 0 && !S_ISDIR(root_st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(
        Shown(checkpoint_root, 256), S_ISLNK(root_st.st_mode) ? ": is a symlink: refused" : ": not a folder: refused"));
  }
  if (options.step >= 0) SL_RETURN_IF_ERROR(refuse_step(options.step));  // before anything is read
  // The data position: given, or where the checkpoint records its trainer's
  // step (torchtitan's train_state, a top-level "step"), or AdamW's step
  // (known once the units are read).
  std::string data_step_from = "--data-step";
  int64_t data_step = options.data_step;
  for (const char* entry : {"train_state.step", "step"}) {
    if (data_step >= 0) break;
    SL_ASSIGN_OR_RETURN(std::optional<int64_t> v, src->Int(entry));
    if (!v) continue;
    if (*v < 0 || *v > kMaxStep) return src->Bad(absl::StrCat(entry, " is ", *v, ", not a step"));
    data_step = *v;
    data_step_from = entry;
  }
  SL_RETURN_IF_ERROR(MakeDirs(checkpoint_root));
  SL_ASSIGN_OR_RETURN(UniqueFd root, OpenDirectoryNoFollow(AT_FDCWD, checkpoint_root, checkpoint_root));
  std::string staging = checkpoint_root + "/.import-XXXXXX";
  if (::mkdtemp(staging.data()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(checkpoint_root, ": cannot create a folder to import into"));
  }
  const std::string staging_name = staging.substr(checkpoint_root.size() + 1);
  const std::string file = RankFileName(0);
  // Whatever fails from here leaves nothing behind: no staging folder, no shard without a manifest.
  bool made_step_dir = false;
  std::string step_name;
  auto clean = [&](absl::Status s) {
    (void)::unlinkat(root.get(), (staging_name + "/" + file).c_str(), 0);
    (void)::unlinkat(root.get(), staging_name.c_str(), AT_REMOVEDIR);
    if (!step_name.empty()) (void)::unlinkat(root.get(), (step_name + "/" + file).c_str(), 0);
    if (made_step_dir) (void)::unlinkat(root.get(), step_name.c_str(), AT_REMOVEDIR);
    return s;
  };
  absl::StatusOr<ManifestRankFile> written = WriteUnits(staging, layouts, &importer);
  if (!written.ok()) return clean(written.status());
  const ManifestRankFile rank_file = *written;
  const int64_t step = options.step >= 0 ? options.step : importer.step();
  const std::string step_dir = absl::StrCat(checkpoint_root, "/", StepDirName(step));
  if (absl::Status s = refuse_step(step); !s.ok()) return clean(s);
  if (data_step < 0) {
    data_step = step;
    data_step_from = "the step";
  }
  SL_ASSIGN_OR_RETURN(CheckpointManifest m, NewManifest(job.name, job, 1, step));
  m.data_step = data_step;
  m.ranks = {rank_file};
  // The step's folder is made here or not at all: the import that makes it
  // is the one that writes it, so two imports of one step never mix their
  // shards and manifests (the second is refused, the first unharmed: clean
  // touches the step's folder only once this import made it).
  if (::mkdirat(root.get(), StepDirName(step).c_str(), 0750) == 0) {
    made_step_dir = true;
    step_name = StepDirName(step);
  } else if (errno == EEXIST) {
    if (absl::Status s = refuse_step(step); !s.ok()) return clean(s);
    return clean(absl::FailedPreconditionError(
        absl::StrCat(Shown(step_dir, 256), ": exists without a manifest (another import of this step running, or "
                                           "one that was stopped): remove it, or import as another --step")));
  } else {
    return clean(absl::PermissionDeniedError(absl::StrCat(step_dir, ": cannot create: ", std::strerror(errno))));
  }
  {
    absl::StatusOr<UniqueFd> step_fd = OpenDirectoryNoFollow(root.get(), step_name, step_dir);
    absl::StatusOr<UniqueFd> staging_fd = OpenDirectoryNoFollow(root.get(), staging_name, staging);
    if (!step_fd.ok()) return clean(step_fd.status());
    if (!staging_fd.ok()) return clean(staging_fd.status());
    if (::renameat(staging_fd->get(), file.c_str(), step_fd->get(), file.c_str()) != 0) {
      return clean(absl::InternalError(absl::StrCat(step_dir, ": cannot move the imported shard in: ",
                                                    std::strerror(errno))));
    }
  }
  (void)::unlinkat(root.get(), staging_name.c_str(), AT_REMOVEDIR);
  if (absl::Status s = WriteManifestConfined(checkpoint_root, m); !s.ok()) return clean(s);
  return DcpImportReport{step_dir,       naming.table,        step, data_step, data_step_from,
                         src->tensors_read(), src->bytes_read()};
}

}  // namespace shardline
