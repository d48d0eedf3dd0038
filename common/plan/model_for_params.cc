// A model shape for a parameter count (shardctl plan --params): the most
// conventional GPT-2 or Llama shape within 0.4% of it.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/model/model_shapes.h"
#include "common/plan/plan.h"

namespace shardline {
namespace {

// Parameters of one block and of everything else, by the shape tables.
std::pair<int64_t, int64_t> ParamSplit(ModelConfig m) {
  m.n_layer = 1;
  int64_t block = 0, rest = 0;
  for (int u = 0; u < model::NumUnits(m); ++u) {
    for (const ParamSpec& p : model::UnitParams(m, u)) (model::IsBlock(m, u) ? block : rest) += p.numel();
  }
  return {block, rest};
}

}  // namespace

int DefaultIntermediateSize(int hidden) {
  return std::max(256, static_cast<int>(std::lround(8.0 * hidden / 3 / 256)) * 256);
}

ModelConfig ModelForParams(double params, int vocab_size, int seq_len, const std::string& family) {
  const bool llama = family == "llama";
  auto shape = [&](int hidden, int intermediate_step) {
    ModelConfig m;
    m.family = family;
    m.vocab_size = vocab_size;
    m.block_size = seq_len;
    m.n_embd = hidden;
    m.n_head = hidden / (llama && hidden % 128 == 0 ? 128 : 64);
    if (llama) {
      m.n_kv_head = m.n_head % 4 == 0 ? m.n_head / 4 : m.n_head;
      m.intermediate_size = std::max(256, DefaultIntermediateSize(hidden) + 256 * intermediate_step);
    }
    return m;
  };
  // Among the shapes within 0.4% of `params`, the most conventional one:
  // hidden nearest 128 x layers (GPT-2's and Llama's aspect) and, for llama,
  // heads in groups of four (GQA 4:1). With none that close, the closest.
  ModelConfig best = shape(64, 0), closest = best;
  best.n_layer = closest.n_layer = 1;
  double best_score = 1e300, closest_err = 1e300;
  for (int hidden = 64; hidden <= 65536; hidden += 64) {
    for (int step = llama ? -3 : 0; step <= (llama ? 3 : 0); ++step) {
      ModelConfig m = shape(hidden, step);
      const auto [block, rest] = ParamSplit(m);
      const double want_layers = (params - static_cast<double>(rest)) / static_cast<double>(block);
      // Checked before the int conversion (undefined out of range, or for a
      // NaN): past hidden / 32 layers no shape is taken anyway.
      if (!(want_layers > 0 && want_layers <= hidden / 32 + 1)) continue;
      for (int l : {static_cast<int>(std::floor(want_layers)), static_cast<int>(std::ceil(want_layers))}) {
        if (l < 1 || hidden < 32 * l || hidden > 256 * l) continue;
        m.n_layer = l;
        const double err = std::abs(static_cast<double>(l) * block + rest - params) / params;
        if (err < closest_err) {
          closest_err = err;
          closest = m;
        }
        const double score = std::abs(std::log(hidden / (128.0 * l))) + (llama && m.n_head % 4 != 0 ? 1.0 : 0.0);
        if (err <= 0.004 && score < best_score) {
          best_score = score;
          best = m;
        }
      }
    }
  }
  if (best_score == 1e300) return closest;
  return best;
}

}  // namespace shardline
