#include "common/metrics/metrics_process.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "common/base/build_info.h"
#include "common/metrics/metrics.h"

namespace shardline::metrics {
namespace {

prometheus::MetricFamily One(const std::string& name, const std::string& help, prometheus::MetricType type,
                             double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) m.counter.value = value;
  else m.gauge.value = value;
  f.metric.push_back(std::move(m));
  return f;
}

// /proc/stat's btime: the boot time in Unix seconds; 0 if unknown.
double BootTime() {
  std::ifstream in("/proc/stat");
  std::string key;
  double v = 0;
  while (in >> key) {
    if (key == "btime" && in >> v) return v;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // not the directory's own descriptor
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  prometheus::MetricFamily build = GaugeFamily(
      "shardline_build_info", "Always 1: the version and git revision of the Shardline program serving this page.");
  AddGauge(&build, {{"version", kVersion}, {"revision", kRevision}}, 1);
  out.push_back(std::move(build));

  // /proc/self/stat: fields after the command's closing parenthesis, from
  // field 3 (state) on; utime 14, stime 15, starttime 22, vsize 23, rss 24.
  std::ifstream in("/proc/self/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  if (paren != std::string::npos) {
    std::istringstream fields(stat.substr(paren + 1));
    std::vector<std::string> f((std::istream_iterator<std::string>(fields)), std::istream_iterator<std::string>());
    auto field = [&](int n) { return n - 3 < static_cast<int>(f.size()) ? std::stod(f[n - 3]) : 0.0; };
    if (f.size() >= 22) {
      const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
      out.push_back(One("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                        MetricType::Counter, (field(14) + field(15)) / ticks));
      out.push_back(One("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
                        field(23)));
      out.push_back(One("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
                        field(24) * static_cast<double>(sysconf(_SC_PAGESIZE))));
      if (const double boot = BootTime(); boot > 0) {
        out.push_back(One("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                          MetricType::Gauge, boot + field(22) / ticks));
      }
    }
  }
  if (const int fds = OpenFds(); fds >= 0) {
    out.push_back(One("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, fds));
  }
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    out.push_back(One("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
                      lim.rlim_cur == RLIM_INFINITY ? -1.0 : static_cast<double>(lim.rlim_cur)));
  }
  return out;
}

}  // namespace shardline::metrics
