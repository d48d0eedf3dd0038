#include "common/metrics.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace shardline::metrics {
namespace {

void AtomicAdd(std::atomic<double>* a, double by) {
  double cur = a->load();
  while (!a->compare_exchange_weak(cur, cur + by)) {
  }
}

bool ValidName(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':')) return false;
  }
  return true;
}

// Label values escape backslash, double quote and newline; help text
// backslash and newline (the format's rules).
std::string Escape(const std::string& s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (quote && c == '"') out += "\\\"";
    else out += c;
  }
  return out;
}

void WriteLabels(const Labels& labels, const char* extra_name, const std::string& extra_value, std::string* out) {
  if (labels.empty() && !extra_name) return;
  *out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) *out += ',';
    first = false;
    *out += k + "=\"" + Escape(v, true) + "\"";
  }
  if (extra_name) {
    if (!first) *out += ',';
    *out += std::string(extra_name) + "=\"" + extra_value + "\"";
  }
  *out += '}';
}

void WriteSample(const std::string& name, const Labels& labels, double v, std::string* out,
                 const char* extra_name = nullptr, const std::string& extra_value = "") {
  *out += name;
  WriteLabels(labels, extra_name, extra_value, out);
  *out += ' ' + FormatValue(v) + '\n';
}

}  // namespace

void Counter::Increment(double by) {
  if (by > 0) AtomicAdd(&value_, by);
}

void Gauge::Increment(double by) { AtomicAdd(&value_, by); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  absl::MutexLock lock(&mu_);
  counts_[i] += 1;
  sum_ += v;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t acc = 0;
  for (uint64_t c : counts_) {
    acc += c;
    s.cumulative.push_back(acc);
  }
  s.count = acc;
  s.sum = sum_;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

FamilyBase::FamilyBase(std::string name, std::string help, std::string type)
    : name_(std::move(name)), help_(std::move(help)), type_(std::move(type)) {}

void FamilyBase::WriteHeader(std::string* out) const {
  *out += "# HELP " + name_ + " " + Escape(help_, false) + "\n";
  *out += "# TYPE " + name_ + " " + type_ + "\n";
}

template <>
void Family<Counter>::Write(std::string* out) const {
  WriteHeader(out);
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, c] : series_) WriteSample(name_, labels, c->Value(), out);
}

template <>
void Family<Gauge>::Write(std::string* out) const {
  WriteHeader(out);
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, g] : series_) WriteSample(name_, labels, g->Value(), out);
}

template <>
void Family<Histogram>::Write(std::string* out) const {
  WriteHeader(out);
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, h] : series_) {
    const Histogram::Snapshot s = h->Read();
    for (size_t i = 0; i < s.upper_bounds.size(); ++i) {
      WriteSample(name_ + "_bucket", labels, static_cast<double>(s.cumulative[i]), out, "le",
                  FormatValue(s.upper_bounds[i]));
    }
    WriteSample(name_ + "_bucket", labels, static_cast<double>(s.count), out, "le", "+Inf");
    WriteSample(name_ + "_sum", labels, s.sum, out);
    WriteSample(name_ + "_count", labels, static_cast<double>(s.count), out);
  }
}

void Registry::CheckName(const std::string& name) const {
  // A bad name is a bug in this program, caught by the first test that runs it.
  if (!ValidName(name)) {
    std::cerr << "metrics: invalid metric name '" << name << "'" << std::endl;
    std::abort();
  }
}

template <typename T>
Family<T>& Registry::Add(const std::string& name, const std::string& help, const char* type,
                         std::function<std::unique_ptr<T>()> make) {
  CheckName(name);
  auto f = std::make_unique<Family<T>>(name, help, type, std::move(make));
  auto* raw = f.get();
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(f));
  return *raw;
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help) {
  return Add<Counter>(name, help, "counter", [] { return std::make_unique<Counter>(); });
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help) {
  return Add<Gauge>(name, help, "gauge", [] { return std::make_unique<Gauge>(); });
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> bounds) {
  return Add<Histogram>(name, help, "histogram", [bounds] { return std::make_unique<Histogram>(bounds); });
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Serialize() const {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  for (auto& c : collectors) c();
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& f : families_) f->Write(&out);
  return out;
}

}  // namespace shardline::metrics
