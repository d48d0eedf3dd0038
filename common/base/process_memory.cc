#include "common/base/process_memory.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace shardline {

int64_t ProcessRssBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * sysconf(_SC_PAGE_SIZE);
}

int64_t ProcessPeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      int64_t kib = 0;
      return in >> kib ? kib * 1024 : 0;
    }
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

}  // namespace shardline
