// Metrics: counters, gauges and histograms with labels, written in
// Prometheus' text exposition format (version 0.0.4).
//
// Why our own: prometheus-cpp is not packaged for Debian 12 and the build may
// fetch nothing but Debian packages, so this is the part of prometheus-cpp's
// model we use (Registry -> Family -> series by labels), about 300 lines.
// The HTTP side is civetweb, as in prometheus-cpp (common/metrics_http.h).
//
// Contract:
//  - Names follow DESIGN.md ("Metrics"): `shardline_` prefix, base units,
//    `_total` on counters. A Family's name and label names are checked when
//    the family is added (a programming error, so it aborts, never on input).
//  - Family::Add returns a reference that stays valid until that series is
//    removed (Remove / Clear) or the registry is destroyed.
//  - Thread safety: every method may be called from any thread. Updates to a
//    series are lock-free for counters and gauges; a histogram takes its own
//    small mutex. Serialize runs the collectors first, then writes a
//    consistent view of each family.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardline::metrics {

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  void Increment(double by = 1);  // `by` < 0 is ignored: counters only go up
  double Value() const { return value_.load(); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v); }
  void Increment(double by = 1);
  double Value() const { return value_.load(); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `upper_bounds` ascending; the +Inf bucket is implied.
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Bucket bounds start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Formats a sample value as Prometheus does: shortest round trip, NaN, +Inf.
std::string FormatValue(double v);

class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, std::string type);
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  virtual void Write(std::string* out) const = 0;
  virtual void Clear() = 0;  // drops every series

 protected:
  void WriteHeader(std::string* out) const;
  const std::string name_, help_, type_;
};

template <typename T>
class Family : public FamilyBase {
 public:
  Family(std::string name, std::string help, std::string type, std::function<std::unique_ptr<T>()> make)
      : FamilyBase(std::move(name), std::move(help), std::move(type)), make_(std::move(make)) {}

  T& Add(const Labels& labels) {
    absl::MutexLock lock(&mu_);
    auto& slot = series_[labels];
    if (!slot) slot = make_();
    return *slot;
  }
  void Remove(const Labels& labels) {
    absl::MutexLock lock(&mu_);
    series_.erase(labels);
  }
  void Clear() override {
    absl::MutexLock lock(&mu_);
    series_.clear();
  }
  void Write(std::string* out) const override;

 private:
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Family<Counter>& AddCounter(const std::string& name, const std::string& help);
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help);
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds);
  // Runs before every Serialize, to refresh gauges computed from state
  // (queue length, heartbeat ages). Must not call Serialize.
  void AddCollector(std::function<void()> collect);
  // The whole registry in the text format, families in the order added.
  std::string Serialize() const;

 private:
  template <typename T>
  Family<T>& Add(const std::string& name, const std::string& help, const char* type,
                 std::function<std::unique_ptr<T>()> make);
  void CheckName(const std::string& name) const;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::metrics
