// Metrics on prometheus-cpp (Debian's prometheus-cpp-dev): a Registry of
// Families of Counter, Gauge and Histogram series, written in Prometheus'
// text format by prometheus-cpp's serializer and served by its Exposer
// (common/metrics/metrics_http.h).
//
// What this file adds to prometheus-cpp, and only that:
//  - Family<T>::Clear(): prometheus::Family removes a series only by its
//    pointer, and a worker drops all of a job's series when the next job
//    begins. A histogram family also keeps its buckets, given once.
//  - Registry::AddCollector: hooks run before every collection, to refresh
//    a series read from the process at scrape time (the worker's RSS).
//  - ExponentialBuckets, which prometheus-cpp 1.0 lacks.
//
// Contract:
//  - Names follow docs/design.md ("Metrics"): `shardline_` prefix, base units,
//    `_total` on counters. prometheus-cpp checks a family's name and label
//    names when it is added and throws std::invalid_argument: a programming
//    error, caught by the first test that runs the program.
//  - Family::Add returns a reference that stays valid until that series is
//    removed (Remove / Clear) or the registry is destroyed.
//  - Thread safety: every method may be called from any thread (prometheus-cpp
//    series update atomically; families and the registry take their locks).
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardline::metrics {

using Labels = prometheus::Labels;  // std::map<std::string, std::string>
using prometheus::Counter;           // Increment(by): `by` < 0 is ignored
using prometheus::Gauge;
using prometheus::Histogram;

// Bucket bounds start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual void Clear() = 0;  // drops every series
};

template <typename T>
class Family : public FamilyBase {
 public:
  explicit Family(prometheus::Family<T>* family, Histogram::BucketBoundaries buckets = {})
      : family_(family), buckets_(std::move(buckets)) {}

  T& Add(const Labels& labels) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    T*& slot = series_[labels];
    if (!slot) {
      if constexpr (std::is_same_v<T, Histogram>) slot = &family_->Add(labels, buckets_);
      else slot = &family_->Add(labels);
    }
    return *slot;
  }
  void Remove(const Labels& labels) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = series_.find(labels);
    if (it == series_.end()) return;
    family_->Remove(it->second);
    series_.erase(it);
  }
  void Clear() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (auto& [labels, series] : series_) family_->Remove(series);
    series_.clear();
  }

 private:
  prometheus::Family<T>* const family_;  // owned by the registry
  const Histogram::BucketBoundaries buckets_;
  absl::Mutex mu_;
  std::map<Labels, T*> series_ ABSL_GUARDED_BY(mu_);
};

// A prometheus::Registry with collect hooks; itself a Collectable, to
// register with an Exposer (MetricsServer).
class Registry : public prometheus::Collectable {
 public:
  Family<Counter>& AddCounter(const std::string& name, const std::string& help);
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help);
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds);
  // Runs before every collection, to refresh series read at scrape time.
  // Must not collect.
  void AddCollector(std::function<void()> collect) ABSL_LOCKS_EXCLUDED(mu_);
  // The hooks, then every family in the order added.
  std::vector<prometheus::MetricFamily> Collect() const override ABSL_LOCKS_EXCLUDED(mu_);
  // Collect() in the text format (what /metrics serves; for tests).
  std::string Serialize() const;

 private:
  prometheus::Registry registry_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Text format of any collectable's families (prometheus-cpp's serializer).
std::string Serialize(const std::vector<prometheus::MetricFamily>& families);

// Builds a gauge family at scrape time, for Collectables that compute their
// series from state (CoordinatorMetrics' job and worker gauges).
prometheus::MetricFamily GaugeFamily(const std::string& name, const std::string& help);
void AddGauge(prometheus::MetricFamily* family, const Labels& labels, double value);

}  // namespace shardline::metrics
