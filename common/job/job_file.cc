#include "common/job/job_file.h"

#include <glob.h>
#include <sys/stat.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

namespace shardline {

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr int64_t kMaxRanks = 1 << 20;

// Reads one TOML table into typed fields, remembering which keys it used so
// that whatever is left over can be reported as unknown.
class TableReader {
 public:
  TableReader(const toml::table* t, std::string section, std::string source)
      : table_(t), section_(std::move(section)), source_(std::move(source)) {}

  std::string Where(const std::string& key) const {
    return absl::StrCat(source_, ": [", section_, "] ", key);
  }
  void Fail(const std::string& msg) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(msg);
  }

  // An integer within [lo, hi], checked as int64 before it is narrowed.
  template <typename T>
  void Int(const std::string& key, T* out, int64_t lo, int64_t hi) {
    const toml::node* n = Take(key);
    if (!n) return;
    auto v = n->value_exact<int64_t>();
    if (!v) {
      Fail(absl::StrCat(Where(key), " must be an integer"));
    } else if (*v < lo || *v > hi) {
      Fail(absl::StrCat(Where(key), " = ", *v, " is out of range [", lo, ", ", hi, "]"));
    } else {
      *out = static_cast<T>(*v);
    }
  }
  void Double(const std::string& key, double* out) {
    const toml::node* n = Take(key);
    if (!n) return;
    auto v = n->value<double>();  // integers are accepted as numbers too
    if (!v) {
      Fail(absl::StrCat(Where(key), " must be a number"));
    } else if (!std::isfinite(*v)) {
      Fail(absl::StrCat(Where(key), " = ", *v, " must be finite"));
    } else {
      *out = *v;
    }
  }
  void Bool(const std::string& key, bool* out) {
    const toml::node* n = Take(key);
    if (!n) return;
    if (auto v = n->value_exact<bool>()) {
      *out = *v;
    } else {
      Fail(absl::StrCat(Where(key), " must be true or false"));
    }
  }
  void String(const std::string& key, std::string* out) {
    const toml::node* n = Take(key);
    if (!n) return;
    if (auto v = n->value_exact<std::string>()) {
      *out = *v;
    } else {
      Fail(absl::StrCat(Where(key), " must be a string"));
    }
  }
  // A string mapped through `parse`, whose error text is prefixed with the key.
  template <typename T>
  void Enum(const std::string& key, T* out,
            const std::function<absl::StatusOr<T>(const std::string&)>& parse) {
    std::string s;
    const bool had = table_ && table_->contains(key);
    String(key, &s);
    if (!had || !status_.ok()) return;
    auto v = parse(s);
    if (v.ok()) {
      *out = *v;
    } else {
      Fail(absl::StrCat(Where(key), ": ", v.status().message()));
    }
  }
  // A string or an array of strings.
  void StringList(const std::string& key, std::vector<std::string>* out) {
    const toml::node* n = Take(key);
    if (!n) return;
    out->clear();
    if (auto v = n->value_exact<std::string>()) {
      out->push_back(*v);
      return;
    }
    const toml::array* a = n->as_array();
    bool ok = a && !a->empty();
    if (ok) {
      for (const auto& e : *a) {
        auto v = e.value_exact<std::string>();
        ok = ok && v.has_value();
        if (v) out->push_back(*v);
      }
    }
    if (!ok) Fail(absl::StrCat(Where(key), " must be a string or a non-empty array of strings"));
  }
  void DoublePair(const std::string& key, std::array<double, 2>* out) {
    const toml::node* n = Take(key);
    if (!n) return;
    const toml::array* a = n->as_array();
    if (!a || a->size() != 2 || !(*a)[0].value<double>() || !(*a)[1].value<double>()) {
      Fail(absl::StrCat(Where(key), " must be an array of two numbers"));
      return;
    }
    (*out)[0] = *(*a)[0].value<double>();
    (*out)[1] = *(*a)[1].value<double>();
  }

  // The keys read so far, in the order they were first read.
  const std::vector<std::string>& Read() const { return order_; }

  // Every key the table holds (after Finish, all of them were read).
  std::set<std::string> Present() const {
    std::set<std::string> keys;
    if (table_) {
      for (const auto& [k, v] : *table_) keys.insert(std::string(k.str()));
    }
    return keys;
  }

  absl::Status Finish() {
    if (status_.ok() && table_) {
      for (const auto& [k, v] : *table_) {
        if (!used_.count(std::string(k.str()))) {
          Fail(absl::StrCat(Where(Shown(std::string(k.str()))), ": unknown key"));
          break;
        }
      }
    }
    return status_;
  }

 private:
  const toml::node* Take(const std::string& key) {
    if (!used_.count(key)) order_.push_back(key);
    used_[key] = true;
    return table_ ? table_->get(key) : nullptr;
  }

  const toml::table* table_;
  std::string section_, source_;
  std::map<std::string, bool> used_;
  std::vector<std::string> order_;
  absl::Status status_;
};

absl::StatusOr<DType> ParseDType(const std::string& s) {
  if (s == "fp32" || s == "float32") return DType::kFloat32;
  if (s == "bf16" || s == "bfloat16") return DType::kBFloat16;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", Quoted(s), " (expected fp32 or bf16)"));
}
absl::StatusOr<MomentsDType> ParseMomentsDType(const std::string& s) {
  if (s == "fp32" || s == "float32") return MomentsDType::kFloat32;
  if (s == "bf16" || s == "bfloat16") return MomentsDType::kBFloat16;
  if (s == "8bit") return MomentsDType::kDynamic8Bit;
  return absl::InvalidArgumentError(absl::StrCat("unknown moments dtype ", Quoted(s), " (expected fp32, bf16 or 8bit)"));
}
absl::StatusOr<BackwardPrefetch> ParseBackwardPrefetch(const std::string& s) {
  if (s == "pre") return BackwardPrefetch::kPre;
  if (s == "post") return BackwardPrefetch::kPost;
  if (s == "none") return BackwardPrefetch::kNone;
  return absl::InvalidArgumentError(absl::StrCat("unknown value ", Quoted(s), " (expected pre, post or none)"));
}
absl::StatusOr<DataFormat> ParseDataFormat(const std::string& s) {
  if (s == "llmc") return DataFormat::kLlmc;
  if (s == "text") return DataFormat::kText;
  if (s == "synthetic") return DataFormat::kSynthetic;
  return absl::InvalidArgumentError(absl::StrCat("unknown format ", Quoted(s), " (expected llmc, text or synthetic)"));
}
absl::StatusOr<GradAccumulation> ParseGradAccumulation(const std::string& s) {
  if (s == "sharded") return GradAccumulation::kSharded;
  if (s == "unsharded") return GradAccumulation::kUnsharded;
  return absl::InvalidArgumentError(absl::StrCat("unknown value ", Quoted(s), " (expected sharded or unsharded)"));
}
absl::StatusOr<LrSchedule> ParseLrSchedule(const std::string& s) {
  for (LrSchedule v : {LrSchedule::kCosine, LrSchedule::kLinear, LrSchedule::kConstant, LrSchedule::kWsd}) {
    if (s == LrScheduleName(v)) return v;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule ", Quoted(s), " (expected cosine, linear, constant or wsd)"));
}
absl::StatusOr<LoraBase> ParseLoraBase(const std::string& s) {
  if (s == "sharded") return LoraBase::kSharded;
  if (s == "replicated") return LoraBase::kReplicated;
  return absl::InvalidArgumentError(absl::StrCat("unknown value ", Quoted(s), " (expected sharded or replicated)"));
}
absl::StatusOr<LoraBaseDType> ParseLoraBaseDType(const std::string& s) {
  for (LoraBaseDType d : {LoraBaseDType::kParamDType, LoraBaseDType::kNf4}) {
    if (s == LoraBaseDTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown value ", Quoted(s), " (expected nf4, or param_dtype: the base in [precision] param_dtype)"));
}

// The sections in the order their errors are reported.
constexpr const char* kSections[] = {"job",         "model",     "data",   "train",    "optimizer", "parallelism",
                                     "precision",   "memory",    "prefetch", "lora",   "checkpoint"};

absl::Status CheckSectionNames(const toml::table& root, const std::string& src) {
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    bool known = false;
    for (const char* s : kSections) known |= key == s;
    if (!known) return absl::InvalidArgumentError(absl::StrCat(src, ": [", Shown(key), "]: unknown section"));
    if (!v.is_table()) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": ", key, " must be a [", key, "] table"));
    }
  }
  return absl::OkStatus();
}

// Reads each section's keys into `c`; Finish reports a section's first error.
class SectionReaders {
 public:
  SectionReaders(const toml::table& root, const std::string& src) : root_(root), src_(src) {}
  TableReader& operator[](const char* section) {
    auto it = readers_.find(section);
    if (it == readers_.end()) it = readers_.emplace(section, TableReader(Table(section), section, src_)).first;
    return it->second;
  }
  const toml::table* Table(const char* section) const { return root_.get_as<toml::table>(section); }
  absl::Status Finish() {
    for (const char* s : kSections) {
      absl::Status st = (*this)[s].Finish();
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  const toml::table& root_;
  const std::string& src_;
  std::map<std::string, TableReader> readers_;
};

void ReadJobAndModel(SectionReaders& r, JobConfig& c) {
  TableReader& job = r["job"];
  job.String("name", &c.name);
  job.Int("workers", &c.workers, 1, kMaxRanks);
  job.Int("max_restarts", &c.restart.max_restarts, 0, 1000);
  job.Int("min_workers", &c.restart.min_workers, 1, kMaxRanks);
  job.Double("restart_timeout", &c.restart.restart_timeout);
  TableReader& model = r["model"];
  model.String("family", &c.model.family);
  model.Int("n_layer", &c.model.n_layer, 1, 10000);
  model.Int("n_head", &c.model.n_head, 1, 65536);
  model.Int("n_embd", &c.model.n_embd, 1, 1 << 20);
  model.Int("vocab_size", &c.model.vocab_size, 2, 1 << 24);
  model.Int("n_kv_head", &c.model.n_kv_head, 0, 65536);
  model.Int("intermediate_size", &c.model.intermediate_size, 0, 1 << 22);
  model.Int("head_dim", &c.model.head_dim_override, 0, 65536);
  model.Double("rope_theta", &c.model.rope_theta);
  model.Double("rms_norm_eps", &c.model.rms_norm_eps);
  model.Bool("qkv_bias", &c.model.qkv_bias);
  model.Bool("qk_norm", &c.model.qk_norm);
  model.Bool("tie_word_embeddings", &c.model.tie_word_embeddings);
  model.String("rope_scaling", &c.model.rope_scaling);
  model.Double("rope_scaling_factor", &c.model.rope_scaling_factor);
  model.Double("rope_low_freq_factor", &c.model.rope_low_freq_factor);
  model.Double("rope_high_freq_factor", &c.model.rope_high_freq_factor);
  model.Int("rope_original_max_position", &c.model.rope_original_max_position, 1, 1 << 24);
  model.Int("block_size", &c.model.block_size, 1, 1 << 20);
  model.String("init_from", &c.model.init_from);
  model.String("hf_dir", &c.model.hf_dir);
  c.model.explicit_keys = model.Present();
}

void ReadDataAndTraining(SectionReaders& r, JobConfig& c) {
  TableReader& data = r["data"];
  data.Enum<DataFormat>("format", &c.data.format, ParseDataFormat);
  data.StringList("path", &c.data.train.paths);
  data.StringList("mask_path", &c.data.train.mask_paths);
  data.StringList("val_path", &c.data.val.paths);
  data.StringList("val_mask_path", &c.data.val.mask_paths);
  data.StringList("doc_path", &c.data.train.doc_paths);
  data.StringList("val_doc_path", &c.data.val.doc_paths);
  TableReader& train = r["train"];
  train.Int("steps", &c.train.steps, 1, kMaxInt);
  train.Double("epochs", &c.train.epochs);
  const std::set<std::string> train_keys = train.Present();
  if (train_keys.count("steps") && train_keys.count("epochs")) {
    train.Fail(train.Where("epochs") + ": give steps or epochs, not both");
  } else if (train_keys.count("epochs") && !(c.train.epochs > 0 && c.train.epochs <= 1e6)) {
    train.Fail(absl::StrCat(train.Where("epochs"), " = ", c.train.epochs, " must lie in (0, 1e6]"));
  }
  train.Int("max_nonfinite_skips", &c.train.max_nonfinite_skips, 0, kMaxInt);
  train.Int("batch_size", &c.train.batch_size, 1, 1 << 24);
  train.Int("micro_batch_size", &c.train.micro_batch_size, 1, 1 << 24);
  train.Enum<GradAccumulation>("grad_accumulation", &c.train.grad_accumulation, ParseGradAccumulation);
  train.Int("seed", &c.train.seed, 0, std::numeric_limits<int64_t>::max());
  train.Int("eval_interval", &c.train.eval_interval, 0, kMaxInt);
  train.Int("eval_batches", &c.train.eval_batches, 1, 1 << 20);
  train.Int("log_interval", &c.train.log_interval, 0, kMaxInt);
  TableReader& opt = r["optimizer"];
  opt.Double("lr", &c.optimizer.lr);
  opt.Double("min_lr", &c.optimizer.min_lr);
  opt.Int("warmup_steps", &c.optimizer.warmup_steps, 0, kMaxInt);
  opt.Enum<LrSchedule>("schedule", &c.optimizer.schedule, ParseLrSchedule);
  opt.Int("decay_steps", &c.optimizer.decay_steps, 0, kMaxInt);
  opt.DoublePair("betas", &c.optimizer.betas);
  opt.Double("eps", &c.optimizer.eps);
  opt.Double("weight_decay", &c.optimizer.weight_decay);
  opt.Double("grad_clip", &c.optimizer.grad_clip);
  opt.Enum<DType>("master_dtype", &c.optimizer.master_dtype, ParseDType);
  opt.Enum<MomentsDType>("moments_dtype", &c.optimizer.moments_dtype, ParseMomentsDType);
}

void ReadExecution(SectionReaders& r, JobConfig& c) {
  TableReader& par = r["parallelism"];
  par.Enum<Strategy>("strategy", &c.parallelism.strategy, [&c](const std::string& s) -> absl::StatusOr<Strategy> {
    if (s != "auto") return ParseStrategy(s);
    c.parallelism.auto_strategy = true;
    return Strategy::kFullShard;  // until the coordinator picks
  });
  par.Int("shard_group_size", &c.parallelism.shard_group_size, 0, kMaxRanks);
  par.Bool("sparse_embedding", &c.parallelism.sparse_embedding);
  par.Bool("shard_optimizer_across_replicas", &c.parallelism.shard_optimizer_across_replicas);
  TableReader& prec = r["precision"];
  prec.Enum<DType>("param_dtype", &c.precision.param_dtype, ParseDType);
  prec.Enum<DType>("reduce_dtype", &c.precision.reduce_dtype, ParseDType);
  prec.Enum<DType>("buffer_dtype", &c.precision.buffer_dtype, ParseDType);
  prec.Bool("allow_tf32", &c.precision.allow_tf32);
  TableReader& mem = r["memory"];
  mem.Bool("activation_checkpointing", &c.memory.activation_checkpointing);
  mem.Bool("cpu_offload", &c.memory.cpu_offload);
  mem.Bool("recompute_cheap_ops", &c.memory.recompute_cheap_ops);
  TableReader& pf = r["prefetch"];
  pf.Bool("forward", &c.prefetch.forward);
  pf.Enum<BackwardPrefetch>("backward", &c.prefetch.backward, ParseBackwardPrefetch);
  pf.Int("max_inflight_all_gathers", &c.prefetch.max_inflight_all_gathers, 1, 64);
}

void ReadLoraAndCheckpoint(SectionReaders& r, JobConfig& c) {
  TableReader& lora = r["lora"];
  c.lora.enabled = r.Table("lora") != nullptr;
  lora.Int("rank", &c.lora.rank, 1, 65536);
  lora.Double("alpha", &c.lora.alpha);
  lora.StringList("target_modules", &c.lora.target_modules);
  lora.Double("dropout", &c.lora.dropout);
  lora.String("init_from", &c.lora.init_from);
  lora.Enum<LoraBase>("base", &c.lora.base, ParseLoraBase);
  lora.Enum<LoraBaseDType>("base_dtype", &c.lora.base_dtype, ParseLoraBaseDType);
  c.lora.explicit_keys = lora.Present();
  TableReader& ck = r["checkpoint"];
  ck.String("dir", &c.checkpoint.dir);
  ck.Int("interval", &c.checkpoint.interval, 0, kMaxInt);
  ck.Double("interval_seconds", &c.checkpoint.interval_seconds);
  ck.Int("keep_latest", &c.checkpoint.keep_latest, 0, 1 << 20);
  ck.Bool("async", &c.checkpoint.async);
  ck.Bool("at_end", &c.checkpoint.at_end);
}

absl::Status ReadSections(const toml::table& root, const std::string& src, JobConfig& c) {
  SL_RETURN_IF_ERROR(CheckSectionNames(root, src));
  SectionReaders readers(root, src);
  ReadJobAndModel(readers, c);
  ReadDataAndTraining(readers, c);
  ReadExecution(readers, c);
  ReadLoraAndCheckpoint(readers, c);
  SL_RETURN_IF_ERROR(readers.Finish());
  // A job always says what it trains: an empty file is a mistake, not a request for defaults.
  if (!readers.Table("model")) return absl::InvalidArgumentError(absl::StrCat(src, ": no [model] section"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobConfig> ParseJobConfig(const std::string& toml_text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    // toml++ quotes what it saw, newlines and all: the error stays one line.
    const std::string what = Shown(std::string(e.description()), 512);
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", b.line, ":", b.column, ": malformed TOML: ", what));
  }
  JobConfig c;
  absl::Status s = ReadSections(root, source, c);
  if (!s.ok()) return s;
  const toml::table* train = root["train"].as_table();
  c.train.auto_grad_accumulation = c.parallelism.auto_strategy && !(train && train->contains("grad_accumulation"));
  const toml::table* par = root["parallelism"].as_table();
  c.parallelism.auto_sparse_embedding =
      c.parallelism.auto_strategy && !(par && par->contains("sparse_embedding"));
  return c;
}

std::vector<std::string> JobFileKeys() {
  const toml::table empty;
  SectionReaders readers(empty, "keys");
  JobConfig c;
  ReadJobAndModel(readers, c);
  ReadDataAndTraining(readers, c);
  ReadExecution(readers, c);
  ReadLoraAndCheckpoint(readers, c);
  std::vector<std::string> keys;
  for (const char* s : kSections) {
    for (const std::string& k : readers[s].Read()) keys.push_back(absl::StrCat(s, ".", k));
  }
  return keys;
}

std::string ResolveJobPath(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
}

absl::StatusOr<std::vector<std::string>> ExpandDataPaths(const std::vector<std::string>& patterns,
                                                         const std::string& base_dir, const std::string& key) {
  std::vector<std::string> files;
  for (const std::string& p : patterns) {
    const std::string full = ResolveJobPath(base_dir, p);
    glob_t g;
    const int rc = glob(full.c_str(), 0, nullptr, &g);  // matches come sorted
    std::vector<std::string> matches;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    std::vector<std::string> regular;
    for (const std::string& m : matches) {
      struct stat st;
      if (stat(m.c_str(), &st) == 0 && S_ISREG(st.st_mode)) regular.push_back(m);
    }
    if (regular.empty() && !matches.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": ", Shown(matches[0], 256), ": not a regular file (a directory or device)"));
    }
    if (regular.empty()) return absl::NotFoundError(absl::StrCat(key, ": ", Shown(full, 256), ": no such file"));
    files.insert(files.end(), regular.begin(), regular.end());
  }
  return files;
}

}  // namespace shardline
