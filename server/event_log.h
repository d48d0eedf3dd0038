// EventLog: the coordinator's own log, one line per event an operator acts
// on (a job's change of state, a worker joining or lost, a restart, a
// checkpoint committed), as text for people or as JSON for log collectors
// (Loki, Fluent Bit, journald's JSON fields).
//
//   text: 2026-11-25T09:00:00.123Z job_state job=j-1 from=PENDING to=RUNNING message="placed on 2 workers"
//   json: {"time":"2026-11-25T09:00:00.123Z","event":"job_state","job":"j-1","from":"PENDING",...}
//
// Every event is one line whatever its values hold: text quotes a value
// with a space, a quote or a control character and escapes it (C escapes);
// JSON escapes as JSON does. Values come from users (job names, messages)
// and workers (hosts): they are bounded by the callers (the core's own
// limits), not here.
//
// Threads: Emit may be called from any thread, and is called with the
// coordinator core's lock held: it never blocks on the output. Lines are
// queued (at most `max_queued`) and written by the log's own thread; a line
// that finds the queue full is dropped and counted, and the next line
// written says how many were lost, so that a stalled stderr (a full pipe)
// can slow the log but never the coordinator. The destructor writes what is
// queued and joins the thread.
#pragma once

#include <cstdio>
#include <deque>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace shardline {

enum class LogFormat { kText, kJson };

// "text" or "json"; false for any other name.
bool ParseLogFormat(std::string_view name, LogFormat* out);

class EventLog {
 public:
  // Writes to `out` (not owned; must outlive the log), flushing every line.
  EventLog(LogFormat format, std::FILE* out, size_t max_queued = 4096);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // `fields`: an object of strings, numbers and booleans, in the order they
  // are to be printed (ordered_json).
  void Emit(std::string_view event, nlohmann::ordered_json fields, absl::Time when = absl::Now());

  // One line as `format` writes it (without the newline): for tests and for
  // the writer thread.
  static std::string Format(LogFormat format, absl::Time when, std::string_view event,
                            const nlohmann::ordered_json& fields);

 private:
  void Loop();

  const LogFormat format_;
  std::FILE* const out_;
  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardline
