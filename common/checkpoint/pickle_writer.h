// PickleWriter: writes a Python pickle (protocol 2) opcode by opcode, for the
// two files a DCP checkpoint holds that Python reads with pickle: torch.save's
// data.pkl (a tensor, or a plain value) and `.metadata` (DCP's dataclasses).
// The caller states the structure as Python's own pickler would emit it:
// containers by MARK ... TUPLE / SETITEMS / APPENDS, objects by GLOBAL,
// arguments and NEWOBJ or REDUCE, then BUILD with their state. Nothing is
// memoized (Python's unpickler does not need it).
//
// Threads: one writer per thread. No errors: every call appends.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace shardline {

class PickleWriter {
 public:
  PickleWriter();  // PROTO 2

  PickleWriter& None();
  PickleWriter& Bool(bool b);
  PickleWriter& Int(int64_t i);
  PickleWriter& Float(double d);
  PickleWriter& String(absl::string_view s);  // a str (UTF-8)
  PickleWriter& Global(absl::string_view module, absl::string_view name);
  PickleWriter& Mark();
  PickleWriter& Tuple();       // the values since the last Mark
  PickleWriter& EmptyTuple();
  PickleWriter& EmptyList();
  PickleWriter& EmptyDict();
  PickleWriter& SetItems();    // key, value pairs since the last Mark into the dict below it
  PickleWriter& Appends();     // values since the last Mark onto the list below it
  PickleWriter& NewObj();      // cls, args -> cls.__new__(cls, *args)
  PickleWriter& Reduce();      // callable, args -> callable(*args)
  PickleWriter& Build();       // obj, state -> obj with its state set
  PickleWriter& PersistentId();  // pid -> persistent_load(pid)

  // Ints as a tuple (MARK ints TUPLE).
  PickleWriter& IntTuple(const int64_t* v, size_t n);

  // STOP, and the pickle.
  std::string Finish();

 private:
  PickleWriter& Op(char op);
  std::string out_;
};

}  // namespace shardline
