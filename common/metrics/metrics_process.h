// ProcessCollector: what every Shardline /metrics page carries about the
// process serving it, as exporters conventionally do (prometheus-cpp 1.0 has
// no process collector):
//   shardline_build_info{version,revision} 1   (common/base/build_info.h)
//   process_cpu_seconds_total, process_resident_memory_bytes,
//   process_virtual_memory_bytes, process_open_fds, process_max_fds,
//   process_start_time_seconds                 (read from /proc/self)
// Read at every scrape; a file that cannot be read leaves its metric out.
// Thread-safe (it holds no state).
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

namespace shardline::metrics {

class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace shardline::metrics
