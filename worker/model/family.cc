#include "worker/model/family.h"

#include <ATen/CPUGeneratorImpl.h>

#include "worker/model/gpt.h"
#include "worker/model/llama.h"

namespace shardline {

at::Tensor ModelFamily::HeadLoss(const at::Tensor& x, const Weights& head, const Weights& embed,
                                 const at::Tensor& targets, double loss_scale) const {
  at::Tensor logits = HeadLogits(x, head, embed);
  const int64_t V = logits.size(2);
  at::Tensor ce = at::cross_entropy_loss(logits.reshape({-1, V}).to(at::kFloat), targets.reshape({-1}),
                                         /*weight=*/{}, at::Reduction::Sum);
  return ce * loss_scale;
}

std::unique_ptr<ModelFamily> MakeModelFamily(const ModelConfig& m) {
  if (m.is_llama()) return std::make_unique<LlamaFamily>(m);
  return std::make_unique<GptFamily>(m);
}

namespace {
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

void SeededNormal(const std::string& name, uint64_t seed, double std, at::Tensor w) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ (Fnv1a(name) * 0x9E3779B97F4A7C15ull));
  w.normal_(0.0, std, gen);
}

}  // namespace shardline
