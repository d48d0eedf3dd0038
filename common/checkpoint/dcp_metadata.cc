#include "common/checkpoint/dcp_metadata.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"
#include "common/checkpoint/pickle_reader.h"
#include "common/checkpoint/pickle_writer.h"

namespace shardline {
namespace {

using Kind = PickleValue::Kind;
constexpr char kMeta[] = "torch.distributed.checkpoint.metadata.";

const char* const kDtypes[] = {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                               "uint8", "bool"};

std::set<std::string> AllowedGlobals() {
  std::set<std::string> g;
  for (const char* c : {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"}) {
    g.insert(absl::StrCat(kMeta, c));
  }
  g.insert("torch.distributed.checkpoint.filesystem._StorageInfo");
  g.insert("torch.Size");
  g.insert("torch.serialization._get_layout");
  g.insert("pathlib.PosixPath");  // StorageMeta.checkpoint_id
  for (const char* d : kDtypes) g.insert(absl::StrCat("torch.", d));
  return g;
}

// Reading one entry: `where` names it in errors.
class Decoder {
 public:
  // `file_bytes`: the pickle's size. What a real file keeps is bounded by
  // it: each kept integer (8 bytes charged) costs at least 2 bytes of
  // pickle and each size tuple (24) at least 6, so a real file keeps at
  // most 4x its bytes; 8x, plus 1 MiB for small files, leaves a margin.
  // Only memoized references repeated past that (a few bytes each for a
  // whole chunk) keep more: refused before they cost more than the file.
  Decoder(const std::string& source, int64_t file_bytes)
      : source_(source), kept_budget_(std::min(kKeptBudget, 8 * file_bytes + (int64_t{1} << 20))) {}

  // d->Get(key), charged to a budget: entries may be shared through the memo,
  // so a small file can ask for many lookups in one large dict.
  const PickleValue* Field(const PickleValue* d, absl::string_view key) {
    if (!d || !d->Is(Kind::kDict)) return nullptr;
    spent_ += static_cast<int64_t>(d->entries.size()) + 1;
    return spent_ <= kLookupBudget ? d->Get(key) : nullptr;
  }
  bool OverBudget() const { return spent_ > kLookupBudget || kept_ > kept_budget_; }

  absl::Status Bad(const std::string& where, const std::string& what) const {
    if (spent_ > kLookupBudget) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": more than ", kLookupBudget,
                                                     " dict entries looked at: not a checkpoint's metadata"));
    }
    if (kept_ > kept_budget_) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": more than ", kept_budget_,
          " bytes of names and sizes (8 for each byte of the file, plus 1 MiB): not a checkpoint's metadata"));
    }
    // (`where` and `what` may hold names from the file: shown escaped.)
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", Shown(where, 300), ": ", Shown(what, 300)));
  }

  // A dataclass instance of `cls` (NEWOBJ, then BUILD with a dict): its state.
  absl::StatusOr<const PickleValue*> State(const PickleValue* v, const std::string& cls, const std::string& where) {
    if (!v || !v->IsObject(absl::StrCat(kMeta, cls)) || !v->state || !v->state->Is(Kind::kDict)) {
      return Bad(where, absl::StrCat("not a ", cls));
    }
    return v->state;
  }

  // torch.Size((ints...)), or a plain tuple of ints.
  absl::StatusOr<std::vector<int64_t>> Ints(const PickleValue* v, const std::string& where) {
    if (v && v->IsObject("torch.Size") && v->items.size() == 1) v = v->items[0];
    if (!v || !v->Is(Kind::kTuple)) return Bad(where, "not a torch.Size");
    if (v->items.size() > 16) return Bad(where, "more than 16 dimensions");
    // What is kept is charged: a memoized entry can be repeated for a few
    // bytes each, so the file's size alone does not bound it.
    kept_ += 24 + 8 * static_cast<int64_t>(v->items.size());
    if (OverBudget()) return Bad(where, "over budget");
    std::vector<int64_t> out;
    for (const PickleValue* e : v->items) {
      if (!e->Is(Kind::kInt) || e->i < 0) return Bad(where, "not a size of non-negative integers");
      out.push_back(e->i);
    }
    return out;
  }

  absl::StatusOr<std::string> String(const PickleValue* v, const std::string& where) {
    if (!v || !v->Is(Kind::kString)) return Bad(where, "not a string");
    if (v->s.size() > 4096) return Bad(where, "a name longer than 4096 bytes");
    kept_ += 32 + static_cast<int64_t>(v->s.size());
    if (OverBudget()) return Bad(where, "over budget");
    return v->s;
  }

  absl::StatusOr<int64_t> Int(const PickleValue* v, const std::string& where) {
    if (!v || !v->Is(Kind::kInt) || v->i < 0) return Bad(where, "not a non-negative integer");
    return v->i;
  }

  absl::StatusOr<DcpTensorMeta> Tensor(const PickleValue* state, const std::string& fqn) {
    DcpTensorMeta t;
    // TensorProperties: BUILD with a tuple (dtype, layout, requires_grad, memory_format, pin_memory).
    const PickleValue* props = Field(state, "properties");
    if (!props || !props->IsObject(absl::StrCat(kMeta, "TensorProperties")) || !props->state ||
        !props->state->Is(Kind::kTuple) || props->state->items.empty() ||
        !props->state->items[0]->Is(Kind::kGlobal)) {
      return Bad(fqn, "no TensorProperties with a dtype");
    }
    const std::string& dtype = props->state->items[0]->s;
    if (dtype.rfind("torch.", 0) != 0) return Bad(fqn, absl::StrCat("dtype ", dtype, " is not torch's"));
    t.dtype = dtype.substr(6);
    auto size = Ints(Field(state, "size"), fqn + " size");
    if (!size.ok()) return size.status();
    t.size = *size;
    const PickleValue* chunks = Field(state, "chunks");
    if (!chunks || !chunks->Is(Kind::kList)) return Bad(fqn, "no list of chunks");
    for (const PickleValue* c : chunks->items) {
      auto cs = State(c, "ChunkStorageMetadata", fqn + " chunk");
      if (!cs.ok()) return cs.status();
      auto offsets = Ints(Field(*cs, "offsets"), fqn + " chunk offsets");
      if (!offsets.ok()) return offsets.status();
      auto sizes = Ints(Field(*cs, "sizes"), fqn + " chunk sizes");
      if (!sizes.ok()) return sizes.status();
      if (offsets->size() != t.size.size() || sizes->size() != t.size.size()) {
        return Bad(fqn, "a chunk of another rank than its tensor");
      }
      for (size_t d = 0; d < t.size.size(); ++d) {
        if ((*offsets)[d] > t.size[d] || (*sizes)[d] > t.size[d] - (*offsets)[d]) {
          return Bad(fqn, absl::StrCat("a chunk outside the tensor in dimension ", d));
        }
      }
      t.chunks.push_back({*offsets, *sizes});
    }
    return t;
  }

  absl::StatusOr<DcpStorage> Storage(const PickleValue* key, const PickleValue* value) {
    auto index = State(key, "MetadataIndex", "storage_data key");
    if (!index.ok()) return index.status();
    DcpStorage s;
    auto fqn = String(Field(*index, "fqn"), "storage_data key fqn");
    if (!fqn.ok()) return fqn.status();
    s.fqn = *fqn;
    if (const PickleValue* o = Field(*index, "offset"); o && !o->Is(Kind::kNone)) {
      auto offsets = Ints(o, s.fqn + " storage offset");
      if (!offsets.ok()) return offsets.status();
      s.chunk_offsets = *offsets;
    }
    if (!value || !value->IsObject("torch.distributed.checkpoint.filesystem._StorageInfo") || !value->state ||
        !value->state->Is(Kind::kDict)) {
      return Bad(s.fqn, "storage_data value is not a _StorageInfo");
    }
    auto path = String(Field(value->state, "relative_path"), s.fqn + " relative_path");
    if (!path.ok()) return path.status();
    // DCP names its files __<rank>_<n>.distcp: letters, digits, '.', '_' and
    // '-' only, which also keeps a name that reaches an error message plain.
    const bool plain = std::all_of(path->begin(), path->end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    });
    if (path->empty() || !plain || *path == "." || *path == "..") {
      return Bad(s.fqn, absl::StrCat("storage file ", *path, " is not a file name in the checkpoint directory"));
    }
    s.relative_path = *path;
    auto offset = Int(Field(value->state, "offset"), s.fqn + " offset");
    if (!offset.ok()) return offset.status();
    auto length = Int(Field(value->state, "length"), s.fqn + " length");
    if (!length.ok()) return length.status();
    s.offset = *offset;
    s.length = *length;
    return s;
  }

 private:
  static constexpr int64_t kLookupBudget = int64_t{1} << 26;
  // Bytes of names and sizes kept in DcpMetadata (a 70B model with AdamW at
  // 1024 ranks keeps ~100 MB).
  static constexpr int64_t kKeptBudget = int64_t{1} << 30;
  const std::string& source_;
  const int64_t kept_budget_;
  int64_t spent_ = 0, kept_ = 0;
};

}  // namespace

absl::StatusOr<DcpMetadata> ParseDcpMetadata(absl::string_view data, const std::string& source) {
  PickleReader reader(AllowedGlobals());
  absl::StatusOr<const PickleValue*> root = reader.Read(data, source);
  if (!root.ok()) return root.status();
  Decoder dec(source, static_cast<int64_t>(data.size()));
  auto top = dec.State(*root, "Metadata", "the root");
  if (!top.ok()) return top.status();
  DcpMetadata m;
  const PickleValue* sdm = dec.Field(*top, "state_dict_metadata");
  if (!sdm || !sdm->Is(Kind::kDict)) return dec.Bad("Metadata", "no state_dict_metadata");
  for (const auto& [k, v] : sdm->entries) {
    auto fqn = dec.String(k, "a state_dict_metadata key");
    if (!fqn.ok()) return fqn.status();
    if (v->IsObject(absl::StrCat(kMeta, "BytesStorageMetadata"))) {
      m.values.push_back(*fqn);
      continue;
    }
    auto state = dec.State(v, "TensorStorageMetadata", *fqn);
    if (!state.ok()) return state.status();
    auto t = dec.Tensor(*state, *fqn);
    if (!t.ok()) return t.status();
    if (!m.tensors.emplace(*fqn, *std::move(t)).second) return dec.Bad(*fqn, "listed twice");
  }
  const PickleValue* sd = dec.Field(*top, "storage_data");
  if (!sd || !sd->Is(Kind::kDict)) return dec.Bad("Metadata", "no storage_data (not a FileSystemWriter checkpoint)");
  for (const auto& [k, v] : sd->entries) {
    auto s = dec.Storage(k, v);
    if (!s.ok()) return s.status();
    m.storage.push_back(*std::move(s));
  }
  if (const PickleValue* v = dec.Field(*top, "version"); v && v->Is(Kind::kString)) m.version = v->s;
  return m;
}

namespace {

constexpr char kMetaModule[] = "torch.distributed.checkpoint.metadata";

// A dataclass as Python pickles it: cls.__new__(cls), then its __dict__ set
// from a dict whose entries `fill` writes (MARK key value ... SETITEMS).
template <typename Fill>
void Dataclass(PickleWriter& p, const char* module, const char* cls, Fill fill) {
  p.Global(module, cls).EmptyTuple().NewObj().EmptyDict().Mark();
  fill();
  p.SetItems().Build();
}

void TorchSize(PickleWriter& p, const std::vector<int64_t>& v) {
  p.Global("torch", "Size").Mark().IntTuple(v.data(), v.size()).Tuple().Reduce();
}

void TensorMeta(PickleWriter& p, const DcpTensorMeta& t) {
  Dataclass(p, kMetaModule, "TensorStorageMetadata", [&] {
    // TensorProperties pickles its state as a tuple (its __getstate__):
    // (dtype, layout, requires_grad, memory_format, pin_memory).
    p.String("properties").Global(kMetaModule, "TensorProperties").EmptyTuple().NewObj().Mark();
    p.Global("torch", t.dtype);
    p.Global("torch.serialization", "_get_layout").Mark().String("torch.strided").Tuple().Reduce();
    p.Bool(false);
    p.Global(kMetaModule, "_MEM_FORMAT_ENCODING").Mark().Int(0).Tuple().Reduce();  // TORCH_CONTIGUOUS
    p.Bool(false).Tuple().Build();
    p.String("size");
    TorchSize(p, t.size);
    p.String("chunks").EmptyList().Mark();
    for (const DcpChunk& c : t.chunks) {
      Dataclass(p, kMetaModule, "ChunkStorageMetadata", [&] {
        p.String("offsets");
        TorchSize(p, c.offsets);
        p.String("sizes");
        TorchSize(p, c.sizes);
      });
    }
    p.Appends();
  });
}

}  // namespace

std::string WriteDcpMetadata(const DcpMetadata& m) {
  PickleWriter p;
  Dataclass(p, kMetaModule, "Metadata", [&] {
    p.String("state_dict_metadata").EmptyDict().Mark();
    for (const auto& [fqn, t] : m.tensors) {
      p.String(fqn);
      TensorMeta(p, t);
    }
    for (const std::string& fqn : m.values) {
      p.String(fqn).Global(kMetaModule, "BytesStorageMetadata").EmptyTuple().NewObj();
    }
    p.SetItems();
    p.String("planner_data").EmptyDict().Mark();
    for (const auto& [fqn, path] : m.planner_data) {
      p.String(fqn).Mark();
      for (const DcpPathPart& part : path) part.index >= 0 ? p.Int(part.index) : p.String(part.key);
      p.Tuple();
    }
    p.SetItems();
    p.String("storage_data").EmptyDict().Mark();
    for (const DcpStorage& s : m.storage) {
      Dataclass(p, kMetaModule, "MetadataIndex", [&] {
        p.String("fqn").String(s.fqn).String("offset");
        if (m.tensors.count(s.fqn)) {
          TorchSize(p, s.chunk_offsets);
        } else {
          p.None();
        }
        p.String("index").None();
      });
      Dataclass(p, "torch.distributed.checkpoint.filesystem", "_StorageInfo", [&] {
        p.String("relative_path").String(s.relative_path).String("offset").Int(s.offset);
        p.String("length").Int(s.length).String("transform_descriptors").None();
      });
    }
    p.SetItems();
    p.String("storage_meta").None();
    p.String("version").String(m.version.empty() ? "1.0.0" : m.version);
  });
  return p.Finish();
}

}  // namespace shardline
