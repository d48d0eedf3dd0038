// CPU time this process and this thread have used, as the kernel counts it
// (clock_gettime's CPUTIME clocks: user and system time, every core summed).
//
// Against wall time these say where a step's seconds went on a machine whose
// cores are shared: the step thread's compute, and what the process's other
// threads (the collectives' transport, the metrics server) burned beside it.
// Both return 0 where the clock is unavailable; any thread may call them.
#pragma once

#include <time.h>

namespace shardline {

namespace internal {
inline double CpuSeconds(clockid_t clock) {
  timespec ts{};
  if (clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
}  // namespace internal

inline double ProcessCpuSeconds() { return internal::CpuSeconds(CLOCK_PROCESS_CPUTIME_ID); }
inline double ThreadCpuSeconds() { return internal::CpuSeconds(CLOCK_THREAD_CPUTIME_ID); }

}  // namespace shardline
