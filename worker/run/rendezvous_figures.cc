#include "worker/run/rendezvous_figures.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_shapes.h"
#include "worker/engine/engine.h"
#include "worker/model/family.h"

namespace shardline {
namespace {

// Seconds of CPU every thread of this process has run.
absl::StatusOr<double> ProcessCpuSeconds() {
  timespec t{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) != 0) {
    return absl::InternalError(absl::StrCat("clock_gettime(CLOCK_PROCESS_CPUTIME_ID): ", std::strerror(errno)));
  }
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The shape MeasureCompute times: a micro-batch, halved (sequences first,
// then tokens, down to 64) until a call is at most kComputeFlopsPerCall.
ModelConfig MeasuredShape(const JobConfig& config, int* sequences) {
  ModelConfig m = config.model;
  int b = std::max(1, config.train.micro_batch_size);
  auto flops = [&] {
    const model::BlockFlops f = model::BlockFlopsPerToken(m);
    return static_cast<double>(b) * m.block_size * (f.forward + f.backward);
  };
  while (flops() > kComputeFlopsPerCall && (b > 1 || m.block_size > 64)) {
    if (b > 1) {
      b /= 2;
    } else {
      m.block_size = std::max(64, m.block_size / 2);
    }
  }
  *sequences = b;
  return m;
}

}  // namespace

absl::StatusOr<LinkFigures> MeasureLink(comm::Communicator& c, const Device& device, absl::Duration timeout) {
  constexpr int64_t kFloats = 2 << 20;  // 8 MiB: past the latency-bound sizes
  at::Tensor t = device.Zeros(kFloats, at::kFloat);
  std::vector<double> rates;
  double cpu = 0;
  int64_t sent = 0;  // by the timed calls, as the communicator counts them
  for (int i = 0; i < 4; ++i) {
    const int64_t sent0 = c.Stats().of(comm::Op::kAllReduce).bytes_sent;
    SL_ASSIGN_OR_RETURN(const double cpu0, ProcessCpuSeconds());
    const absl::Time t0 = absl::Now();
    std::shared_ptr<comm::Work> w = c.AllReduce(t);
    SL_RETURN_IF_ERROR(w->Wait(timeout));
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    SL_ASSIGN_OR_RETURN(const double cpu1, ProcessCpuSeconds());
    // nccl-tests' busbw for a ring all-reduce; the first call warms up.
    if (i > 0 && s > 0) rates.push_back(2.0 * (c.size() - 1) / c.size() * kFloats * 4 / s);
    if (i > 0) {
      cpu += cpu1 - cpu0;
      sent += c.Stats().of(comm::Op::kAllReduce).bytes_sent - sent0;
    }
  }
  std::sort(rates.begin(), rates.end());
  LinkFigures out;
  out.bus_bandwidth = rates.empty() ? 0 : rates[rates.size() / 2];
  if (!c.ordered_on_device() && sent > 0) out.cpu_s_per_byte = cpu / static_cast<double>(sent);
  return out;
}

absl::StatusOr<ComputeFigures> MeasureCompute(const JobConfig& config, const Device& device) {
  if (device.is_cuda()) return ComputeFigures{};
  if (model::BlockParams(config.model) > kMaxMeasuredBlockParams) return ComputeFigures{};
  int sequences = 1;
  const ModelConfig m = MeasuredShape(config, &sequences);
  const at::TensorOptions options = at::TensorOptions().dtype(TorchDType(config.precision.param_dtype));
  // (A generator of its own: the process's default one is left as it was.)
  at::Generator gen = at::detail::createCPUGenerator(0);
  std::vector<at::Tensor> weights;
  for (const ParamSpec& spec : model::UnitParams(m, 1)) {
    weights.push_back(at::randn(spec.shape, gen, options).mul_(0.02).requires_grad_(true));
  }
  const BlockWeights block(weights);
  const std::unique_ptr<ModelFamily> family = MakeModelFamily(m, config.memory.recompute_cheap_ops);
  const at::Tensor x = at::randn({sequences, m.block_size, m.n_embd}, gen, options).requires_grad_(true);
  at::AutoGradMode grad(true);
  auto forward_and_backward = [&] {
    at::Tensor y = family->Block(x, block, Packing{});
    y.backward(at::ones_like(y));
    for (at::Tensor& w : weights) w.mutable_grad().reset();
    x.mutable_grad().reset();
  };
  forward_and_backward();
  SL_ASSIGN_OR_RETURN(const double cpu0, ProcessCpuSeconds());
  const absl::Time t0 = absl::Now();
  constexpr int kTimed = 2;
  for (int i = 0; i < kTimed; ++i) forward_and_backward();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  SL_ASSIGN_OR_RETURN(const double cpu1, ProcessCpuSeconds());
  if (!(seconds > 0)) return ComputeFigures{};
  const model::BlockFlops f = model::BlockFlopsPerToken(m);
  ComputeFigures out;
  out.flops = kTimed * static_cast<double>(sequences) * m.block_size * (f.forward + f.backward) / seconds;
  out.core_share = (cpu1 - cpu0) / seconds;
  return out;
}

absl::StatusOr<AutoFigures> MeasureAutoFigures(comm::Communicator& c, int flows, const JobConfig& config,
                                               const Device& device, absl::Duration timeout) {
  SL_ASSIGN_OR_RETURN(const LinkFigures link, MeasureLink(c, device, timeout));
  AutoFigures out;
  out.bus_bandwidth = link.bus_bandwidth * flows;
  if (link.cpu_s_per_byte <= 0) return out;
  SL_RETURN_IF_ERROR(c.Barrier()->Wait(timeout));  // (every rank computes at once)
  SL_ASSIGN_OR_RETURN(const ComputeFigures compute, MeasureCompute(config, device));
  if (compute.flops > 0 && compute.core_share > 0) {
    out.compute_flops = compute.flops;
    out.comm_cpu_s_per_byte = link.cpu_s_per_byte / compute.core_share;
  }
  return out;
}

absl::StatusOr<std::vector<double>> MeasureSendSeconds(comm::Communicator& c, const Device& device,
                                                       absl::Duration timeout) {
  constexpr int64_t kBytes = 1 << 20;
  at::Tensor t = device.Zeros(kBytes, at::kByte);
  std::vector<double> seconds;
  for (int root = 0; root < c.size(); ++root) {
    // All start together, so that a root's time is its own sending.
    SL_RETURN_IF_ERROR(c.Barrier()->Wait(timeout));
    const absl::Time t0 = absl::Now();
    SL_RETURN_IF_ERROR(c.Broadcast(t, root)->Wait(timeout));
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return seconds;
}

}  // namespace shardline
