#include "client/tensorboard_events.h"

#include <unistd.h>

#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/file_util.h"
#include "common/job/job_config.h"

namespace shardline::ctl {
namespace {

std::array<uint32_t, 256> Crc32cTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// TFRecord's mask, so that a CRC of bytes holding CRCs stays informative.
uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void PutFixed32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutFixed64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
// Protobuf wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
void PutKey(std::string* out, int field, int wire_type) { PutVarint(out, (field << 3) | wire_type); }
void PutBytes(std::string* out, int field, absl::string_view bytes) {
  PutKey(out, field, 2);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// Event: 1 wall_time (double), 2 step (int64), 3 file_version (string),
// 5 summary (Summary: 1 value (Value: 1 tag, 2 simple_value float)).
std::string EventBytes(double wall_time, int64_t step, absl::string_view file_version, absl::string_view tag,
                       float value) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, sizeof bits);
  PutKey(&e, 1, 1);
  PutFixed64(&e, bits);
  PutKey(&e, 2, 0);
  PutVarint(&e, static_cast<uint64_t>(step));
  if (!file_version.empty()) {
    PutBytes(&e, 3, file_version);
    return e;
  }
  std::string v;
  PutBytes(&v, 1, tag);
  uint32_t fbits;
  std::memcpy(&fbits, &value, sizeof fbits);
  PutKey(&v, 2, 5);
  PutFixed32(&v, fbits);
  std::string summary;
  PutBytes(&summary, 1, v);
  PutBytes(&e, 5, summary);
  return e;
}

void PutRecord(std::string* out, absl::string_view data) {
  std::string len;
  PutFixed64(&len, data.size());
  out->append(len);
  PutFixed32(out, Masked(Crc32c(len)));
  out->append(data.data(), data.size());
  PutFixed32(out, Masked(Crc32c(data)));
}

// A name part from the coordinator or the system, kept to a file name's
// safe characters.
std::string FileNamePart(absl::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_');
  return out.empty() ? "_" : out;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  static const std::array<uint32_t, 256> table = Crc32cTable();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

absl::StatusOr<std::string> WriteTensorBoardEvents(const std::string& dir, const v1::Job& job) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat(dir, ": cannot create the directory: ", ec.message()));
  const double now = absl::ToUnixMicros(absl::Now()) / 1e6;
  std::string out;
  PutRecord(&out, EventBytes(now, 0, "brain.Event:2", "", 0));
  for (const v1::StepRecord& s : job.history()) {
    const double t = s.unix_ms() / 1e3;
    auto scalar = [&](absl::string_view tag, double v) {
      if (std::isfinite(v)) PutRecord(&out, EventBytes(t, s.step(), "", absl::StrCat("shardline/", tag), v));
    };
    scalar("loss", s.loss());
    if (s.has_val_loss()) scalar("val_loss", s.val_loss());
    scalar("lr", s.lr());
    scalar("grad_norm", s.grad_norm());
    scalar("tokens_per_second", s.tokens_per_second());
    scalar("epoch", EpochAt(s.step(), job.batch_size(), job.sequences_per_epoch()));
  }
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  // TensorBoard finds files by the "tfevents" in their name.
  const std::string path = absl::StrCat(dir, "/events.out.tfevents.", static_cast<int64_t>(now), ".",
                                        FileNamePart(host), ".shardline.", FileNamePart(job.id()));
  if (absl::Status s = WriteFileAtomically(path, out); !s.ok()) return s;
  return path;
}

}  // namespace shardline::ctl
