// This process's memory as the kernel counts it, from /proc/self.
//
// The peak is VmHWM (the high-water mark of this process image's resident
// set), not getrusage's ru_maxrss: Linux carries ru_maxrss across fork and
// exec, so a rank started by a large parent (a Python harness holding torch,
// a daemon) would report its parent's peak as its own.
//
// Both return 0 where /proc is unreadable; any thread may call them.
#pragma once

#include <cstdint>

namespace shardline {

int64_t ProcessRssBytes();      // resident now (/proc/self/statm)
int64_t ProcessPeakRssBytes();  // VmHWM (/proc/self/status)

}  // namespace shardline
