#include "server/event_log.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace shardline {
namespace {

using Json = nlohmann::ordered_json;

std::string Timestamp(absl::Time t) { return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone()); }

// A value as text: numbers and booleans as JSON writes them, a string bare
// where it is one plain word, else quoted with C escapes (so one line).
std::string TextValue(const Json& v) {
  if (!v.is_string()) return v.dump(-1, ' ', false, Json::error_handler_t::replace);
  const std::string& s = v.get_ref<const std::string&>();
  bool plain = !s.empty();
  for (unsigned char c : s) plain = plain && c > ' ' && c < 0x7f && c != '"' && c != '\\' && c != '=';
  return plain ? s : absl::StrCat("\"", absl::CEscape(s), "\"");
}

}  // namespace

bool ParseLogFormat(std::string_view name, LogFormat* out) {
  if (name == "text") *out = LogFormat::kText;
  else if (name == "json") *out = LogFormat::kJson;
  else return false;
  return true;
}

std::string EventLog::Format(LogFormat format, absl::Time when, std::string_view event, const Json& fields) {
  if (format == LogFormat::kJson) {
    Json line = {{"time", Timestamp(when)}, {"event", event}};
    if (fields.is_object()) {
      for (const auto& [k, v] : fields.items()) line[k] = v;
    }
    // Invalid UTF-8 (a job name is the user's bytes) becomes U+FFFD rather
    // than an exception.
    return line.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  std::string line = absl::StrCat(Timestamp(when), " ", std::string(event));
  if (fields.is_object()) {
    for (const auto& [k, v] : fields.items()) absl::StrAppend(&line, " ", k, "=", TextValue(v));
  }
  return line;
}

EventLog::EventLog(LogFormat format, std::FILE* out, size_t max_queued)
    : format_(format), out_(out), max_queued_(max_queued), thread_([this] { Loop(); }) {}

EventLog::~EventLog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void EventLog::Emit(std::string_view event, Json fields, absl::Time when) {
  std::string line = Format(format_, when, event, fields);
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= max_queued_) {
    ++dropped_;
    return;
  }
  queue_.push_back(std::move(line));
}

void EventLog::Loop() {
  for (;;) {
    std::deque<std::string> lines;
    int64_t dropped = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty() && dropped_ == 0) return;  // stopping, all written
      lines.swap(queue_);
      std::swap(dropped, dropped_);
    }
    if (dropped > 0) {
      const std::string note = Format(format_, absl::Now(), "log_lines_dropped", Json{{"count", dropped}});
      std::fprintf(out_, "%s\n", note.c_str());
    }
    for (const std::string& l : lines) std::fprintf(out_, "%s\n", l.c_str());
    std::fflush(out_);
  }
}

}  // namespace shardline
