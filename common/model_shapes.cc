#include "common/model_shapes.h"

#include "absl/strings/str_cat.h"

namespace shardline::gpt {

int NumUnits(const ModelConfig& m) { return m.n_layer + 2; }
int HeadUnit(const ModelConfig& m) { return m.n_layer + 1; }
bool IsBlock(const ModelConfig& m, int unit) { return unit >= 1 && unit <= m.n_layer; }

std::string UnitName(const ModelConfig& m, int unit) {
  if (unit == 0) return "embed";
  if (unit == HeadUnit(m)) return "head";
  return absl::StrCat("h.", unit - 1);
}

std::vector<ParamSpec> UnitParams(const ModelConfig& m, int unit) {
  const int64_t C = m.n_embd;
  auto p = [](std::string name, std::vector<int64_t> shape) {
    const bool decay = shape.size() >= 2;
    return ParamSpec{std::move(name), std::move(shape), decay};
  };
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

int64_t NumParams(const ModelConfig& m) {
  int64_t n = 0;
  for (int u = 0; u < NumUnits(m); ++u) {
    for (const auto& s : UnitParams(m, u)) n += s.numel();
  }
  return n;
}

double TrainingFlopsPerToken(const ModelConfig& m) {
  const double n = static_cast<double>(NumParams(m)) - static_cast<double>(m.block_size) * m.n_embd;
  const double q = static_cast<double>(m.n_embd) / m.n_head;
  return 6 * n + 12.0 * m.n_layer * m.n_head * q * m.block_size;
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

}  // namespace shardline::gpt
