#include "common/checkpoint/pickle_writer.h"

#include <cstring>

#include "common/base/little_endian.h"

namespace shardline {

PickleWriter::PickleWriter() { out_ = "\x80\x02"; }

PickleWriter& PickleWriter::Op(char op) {
  out_.push_back(op);
  return *this;
}

PickleWriter& PickleWriter::None() { return Op('N'); }
PickleWriter& PickleWriter::Bool(bool b) { return Op(b ? '\x88' : '\x89'); }

PickleWriter& PickleWriter::Int(int64_t i) {
  if (i >= 0 && i < 256) {
    Op('K');
    AppendLittleEndian(&out_, static_cast<uint64_t>(i), 1);
  } else if (i >= 0 && i < 65536) {
    Op('M');
    AppendLittleEndian(&out_, static_cast<uint64_t>(i), 2);
  } else if (i >= INT32_MIN && i <= INT32_MAX) {
    Op('J');
    AppendLittleEndian(&out_, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(i))), 4);
  } else {  // LONG1: 8 bytes of two's complement, little-endian
    Op('\x8a');
    out_.push_back(8);
    AppendLittleEndian(&out_, static_cast<uint64_t>(i), 8);
  }
  return *this;
}

PickleWriter& PickleWriter::Float(double d) {  // BINFLOAT: big-endian IEEE 754
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  Op('G');
  for (int k = 7; k >= 0; --k) out_.push_back(static_cast<char>((bits >> (8 * k)) & 0xff));
  return *this;
}

PickleWriter& PickleWriter::String(absl::string_view s) {  // BINUNICODE
  Op('X');
  AppendLittleEndian(&out_, s.size(), 4);
  out_.append(s.data(), s.size());
  return *this;
}

PickleWriter& PickleWriter::Global(absl::string_view module, absl::string_view name) {
  Op('c');
  out_.append(module.data(), module.size());
  out_.push_back('\n');
  out_.append(name.data(), name.size());
  out_.push_back('\n');
  return *this;
}

PickleWriter& PickleWriter::Mark() { return Op('('); }
PickleWriter& PickleWriter::Tuple() { return Op('t'); }
PickleWriter& PickleWriter::EmptyTuple() { return Op(')'); }
PickleWriter& PickleWriter::EmptyList() { return Op(']'); }
PickleWriter& PickleWriter::EmptyDict() { return Op('}'); }
PickleWriter& PickleWriter::SetItems() { return Op('u'); }
PickleWriter& PickleWriter::Appends() { return Op('e'); }
PickleWriter& PickleWriter::NewObj() { return Op('\x81'); }
PickleWriter& PickleWriter::Reduce() { return Op('R'); }
PickleWriter& PickleWriter::Build() { return Op('b'); }
PickleWriter& PickleWriter::PersistentId() { return Op('Q'); }

PickleWriter& PickleWriter::IntTuple(const int64_t* v, size_t n) {
  Mark();
  for (size_t k = 0; k < n; ++k) Int(v[k]);
  return Tuple();
}

std::string PickleWriter::Finish() {
  Op('.');
  return std::move(out_);
}

}  // namespace shardline
