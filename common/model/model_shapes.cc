#include "common/model/model_shapes.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardline::model {

int NumUnits(const ModelConfig& m) { return m.n_layer + 2; }
int HeadUnit(const ModelConfig& m) { return m.n_layer + 1; }
bool IsBlock(const ModelConfig& m, int unit) { return unit >= 1 && unit <= m.n_layer; }

bool OptimizerInPieces(const ParallelismConfig& p, const ModelConfig& m, int shard_group, int replicas, int unit) {
  if (!p.shard_optimizer_across_replicas || p.strategy != Strategy::kHybridShard || replicas <= 1) return false;
  const bool sparse_trains = p.sparse_embedding && shard_group > 1 && (unit == 0 || unit == HeadUnit(m));
  return !sparse_trains;
}

std::string UnitName(const ModelConfig& m, int unit) {
  if (unit == 0) return "embed";
  if (unit == HeadUnit(m)) return "head";
  return absl::StrCat(m.is_llama() ? "layers." : "h.", unit - 1);
}

namespace {

ParamSpec P(std::string name, std::vector<int64_t> shape) {
  const bool decay = shape.size() >= 2;
  return ParamSpec{std::move(name), std::move(shape), decay};
}

std::vector<ParamSpec> LlamaUnitParams(const ModelConfig& m, int unit) {
  const int64_t C = m.n_embd, D = m.head_dim(), H = m.n_head, KV = m.kv_heads(), I = m.intermediate_size;
  if (unit == 0) return {P("model.embed_tokens.weight", {m.vocab_size, C})};
  if (unit == HeadUnit(m)) {
    std::vector<ParamSpec> out{P("model.norm.weight", {C})};
    if (!m.tied()) out.push_back(P("lm_head.weight", {m.vocab_size, C}));
    return out;
  }
  const std::string l = absl::StrCat("model.layers.", unit - 1, ".");
  std::vector<ParamSpec> out{P(l + "input_layernorm.weight", {C})};
  for (const auto& [proj, rows] : {std::pair<const char*, int64_t>{"q_proj", H * D}, {"k_proj", KV * D},
                                   {"v_proj", KV * D}}) {
    out.push_back(P(l + "self_attn." + proj + ".weight", {rows, C}));
    if (m.qkv_bias) out.push_back(P(l + "self_attn." + proj + ".bias", {rows}));
  }
  out.push_back(P(l + "self_attn.o_proj.weight", {C, H * D}));
  if (m.qk_norm) {
    out.push_back(P(l + "self_attn.q_norm.weight", {D}));
    out.push_back(P(l + "self_attn.k_norm.weight", {D}));
  }
  out.push_back(P(l + "post_attention_layernorm.weight", {C}));
  out.push_back(P(l + "mlp.gate_proj.weight", {I, C}));
  out.push_back(P(l + "mlp.up_proj.weight", {I, C}));
  out.push_back(P(l + "mlp.down_proj.weight", {C, I}));
  return out;
}

}  // namespace

std::vector<ParamSpec> UnitParams(const ModelConfig& m, int unit) {
  if (m.is_llama()) return LlamaUnitParams(m, unit);
  const int64_t C = m.n_embd;
  auto p = P;
  if (unit == 0) {
    return {p("transformer.wte.weight", {m.vocab_size, C}), p("transformer.wpe.weight", {m.block_size, C})};
  }
  if (unit == HeadUnit(m)) {
    return {p("transformer.ln_f.weight", {C}), p("transformer.ln_f.bias", {C})};
  }
  const std::string h = absl::StrCat("transformer.h.", unit - 1, ".");
  return {p(h + "ln_1.weight", {C}),           p(h + "ln_1.bias", {C}),
          p(h + "attn.c_attn.weight", {3 * C, C}), p(h + "attn.c_attn.bias", {3 * C}),
          p(h + "attn.c_proj.weight", {C, C}),     p(h + "attn.c_proj.bias", {C}),
          p(h + "ln_2.weight", {C}),           p(h + "ln_2.bias", {C}),
          p(h + "mlp.c_fc.weight", {4 * C, C}),    p(h + "mlp.c_fc.bias", {4 * C}),
          p(h + "mlp.c_proj.weight", {C, 4 * C}),  p(h + "mlp.c_proj.bias", {C})};
}

namespace {

// The model's shapes as (unit's parameters, copies): the embedding, the head
// and one block standing for all n_layer (the blocks' shapes are the same).
// Counting by closed form keeps the cost independent of n_layer, so an
// unvalidated model with 10^8 layers is counted (and refused) at once.
std::vector<std::pair<std::vector<ParamSpec>, int64_t>> ShapeGroups(const ModelConfig& m) {
  std::vector<std::pair<std::vector<ParamSpec>, int64_t>> out;
  out.emplace_back(UnitParams(m, 0), 1);
  if (m.n_layer >= 1) out.emplace_back(UnitParams(m, 1), m.n_layer);
  if (HeadUnit(m) >= 1) out.emplace_back(UnitParams(m, HeadUnit(m)), 1);
  return out;
}

}  // namespace

int64_t NumParams(const ModelConfig& m) {
  // Checked: each key within its own bound still multiplies past int64
  // (signed overflow is undefined, and wrapped to a negative count it would
  // pass any upper bound).
  constexpr int64_t kSaturated = std::numeric_limits<int64_t>::max();
  int64_t n = 0;
  for (const auto& [params, copies] : ShapeGroups(m)) {
    int64_t unit = 0;
    for (const ParamSpec& s : params) {
      int64_t numel = 1;
      for (int64_t d : s.shape) {
        if (__builtin_mul_overflow(numel, d, &numel)) return kSaturated;
      }
      if (__builtin_add_overflow(unit, numel, &unit)) return kSaturated;
    }
    if (__builtin_mul_overflow(unit, copies, &unit) || __builtin_add_overflow(n, unit, &n)) return kSaturated;
  }
  return n;
}

double ApproxNumParams(const ModelConfig& m) {
  double n = 0;
  for (const auto& [params, copies] : ShapeGroups(m)) {
    double unit = 0;
    for (const ParamSpec& s : params) {
      double numel = 1;
      for (int64_t d : s.shape) numel *= static_cast<double>(d);
      unit += numel;
    }
    n += unit * static_cast<double>(copies);
  }
  return n;
}

double TrainingFlopsPerToken(const ModelConfig& m, const LoraConfig& l) {
  const int64_t lookup = m.is_llama() ? (m.tied() ? 0 : int64_t{m.vocab_size} * m.n_embd)
                                      : int64_t{m.block_size} * m.n_embd;
  const double n = static_cast<double>(NumParams(m) - lookup);
  const double q = m.head_dim();
  const double attention = 12.0 * m.n_layer * m.n_head * q * m.block_size;
  if (!l.enabled) return 6 * n + attention;
  return 4 * n + 6 * static_cast<double>(NumAdapterParams(m, l)) + attention;
}

double BlockParams(const ModelConfig& m) {
  double numel = 0;
  for (const ParamSpec& spec : UnitParams(m, 1)) numel += static_cast<double>(spec.numel());
  return numel;
}

BlockFlops BlockFlopsPerToken(const ModelConfig& m, const LoraConfig& l) {
  const double numel = BlockParams(m);
  const double adapters = l.enabled ? static_cast<double>(NumAdapterParams(m, l)) / m.n_layer : 0;
  const double attention = 12.0 * m.n_head * m.head_dim() * m.block_size;
  return {2 * numel + 2 * adapters + attention / 3, (l.enabled ? 2 : 4) * numel + 4 * adapters + 2 * attention / 3};
}

absl::StatusOr<std::vector<ShardLayout>> OwnershipMap(const ModelConfig& m, int group_size) {
  std::vector<ShardLayout> out;
  for (int u = 0; u < NumUnits(m); ++u) {
    auto l = MakeShardLayout(UnitName(m, u), UnitParams(m, u), group_size);
    if (!l.ok()) return l.status();
    out.push_back(*std::move(l));
  }
  return out;
}

std::vector<std::string> LoraModuleNames(const ModelConfig& m) {
  if (m.is_llama()) return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return {"c_attn", "c_proj", "c_fc"};
}

std::vector<std::string> LoraModules(const ModelConfig& m, const LoraConfig& l) {
  if (l.target_modules.empty()) {
    return m.is_llama() ? std::vector<std::string>{"q_proj", "v_proj"} : std::vector<std::string>{"c_attn"};
  }
  if (l.target_modules.size() == 1 && l.target_modules[0] == "all-linear") return LoraModuleNames(m);
  return l.target_modules;
}

std::vector<LoraTarget> LoraTargets(const ModelConfig& m, const LoraConfig& l, int unit) {
  std::vector<LoraTarget> out;
  if (!l.enabled || !IsBlock(m, unit)) return out;
  const std::vector<std::string> modules = LoraModules(m, l);
  const std::vector<ParamSpec> params = UnitParams(m, unit);
  constexpr std::string_view kWeight = ".weight";
  for (int i = 0; i < static_cast<int>(params.size()); ++i) {
    const ParamSpec& p = params[i];
    if (p.shape.size() != 2) continue;
    const std::string module = p.name.substr(0, p.name.size() - kWeight.size());
    const std::string leaf = module.substr(module.rfind('.') + 1);
    for (const std::string& t : modules) {
      if (t == leaf) out.push_back({i, module, p.shape[1], p.shape[0]});
    }
  }
  return out;
}

std::vector<ParamSpec> AdapterParams(const ModelConfig& m, const LoraConfig& l, int unit) {
  std::vector<ParamSpec> out;
  for (const LoraTarget& t : LoraTargets(m, l, unit)) {
    out.push_back(P(t.module + ".lora_A.weight", {l.rank, t.in}));
    out.push_back(P(t.module + ".lora_B.weight", {t.out, l.rank}));
  }
  return out;
}

int64_t NumAdapterParams(const ModelConfig& m, const LoraConfig& l) {
  int64_t n = 0;
  for (int u = 0; u < NumUnits(m); ++u) {
    for (const auto& s : AdapterParams(m, l, u)) n += s.numel();
  }
  return n;
}

std::vector<int> TrainableUnits(const ModelConfig& m, const LoraConfig& l) {
  std::vector<int> out;
  for (int u = 0; u < NumUnits(m); ++u) {
    if (!l.enabled || !LoraTargets(m, l, u).empty()) out.push_back(u);
  }
  return out;
}

absl::StatusOr<std::vector<ShardLayout>> TrainableOwnershipMap(const ModelConfig& m, const LoraConfig& l,
                                                               int group_size) {
  if (!l.enabled) return OwnershipMap(m, group_size);
  std::vector<ShardLayout> out;
  for (int u : TrainableUnits(m, l)) {
    auto layout = MakeShardLayout(UnitName(m, u) + ".lora", AdapterParams(m, l, u), group_size);
    if (!layout.ok()) return layout.status();
    out.push_back(*std::move(layout));
  }
  return out;
}

}  // namespace shardline::model
