#include "common/metrics/metrics.h"

#include <prometheus/text_serializer.h>

namespace shardline::metrics {

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help) {
  auto f = std::make_unique<Family<Counter>>(&prometheus::BuildCounter().Name(name).Help(help).Register(registry_));
  auto* raw = f.get();
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(f));
  return *raw;
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help) {
  auto f = std::make_unique<Family<Gauge>>(&prometheus::BuildGauge().Name(name).Help(help).Register(registry_));
  auto* raw = f.get();
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(f));
  return *raw;
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> bounds) {
  auto f = std::make_unique<Family<Histogram>>(
      &prometheus::BuildHistogram().Name(name).Help(help).Register(registry_), std::move(bounds));
  auto* raw = f.get();
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(f));
  return *raw;
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::vector<prometheus::MetricFamily> Registry::Collect() const {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  for (auto& c : collectors) c();
  return registry_.Collect();
}

std::string Registry::Serialize() const { return metrics::Serialize(Collect()); }

std::string Serialize(const std::vector<prometheus::MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

prometheus::MetricFamily GaugeFamily(const std::string& name, const std::string& help) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  return f;
}

void AddGauge(prometheus::MetricFamily* family, const Labels& labels, double value) {
  prometheus::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  m.gauge.value = value;
  family->metric.push_back(std::move(m));
}

}  // namespace shardline::metrics
