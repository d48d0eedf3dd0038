// PickleReader: reads a Python pickle (protocols 2 to 5) as data, never as
// code. PyTorch's Distributed Checkpoint (DCP) writes its `.metadata` with
// pickle, and unpickling in Python imports modules and calls whatever globals
// the file names. Here a pickle is run on a small stack machine that knows a
// subset of the opcodes (those of plain data: None, bool, int, float, str,
// bytes, tuple, list, dict, and the object-building ones) and builds a tree of
// PickleValues. A global (GLOBAL, STACK_GLOBAL) must be on the caller's
// allow-list or the read fails naming it; REDUCE, NEWOBJ and BUILD on an
// allowed global only record the class, its arguments and its state for the
// caller to interpret. Nothing is imported, called or looked up.
//
// Errors: any opcode outside the subset, a global outside the allow-list, a
// truncated or malformed stream, a stack underflow, a memo index never
// stored, or a pickle past the bounds below is an InvalidArgument naming
// `source` and the byte offset.
//
// Bounds: at most kMaxValues values, stack entries, open MARKs and argument
// copies (REDUCE, NEWOBJ), strings and bytes no longer than the input. Values live in the reader (an arena) and are freed
// with it, never by recursion. The tree may hold cycles (a memo reference to
// a container still being filled): a consumer walks it to a depth of its own.
//
// Threads: a reader is used by one thread; its values are immutable once Read
// returns.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline {

struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kGlobal, kObject, kPersistentId };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kString (UTF-8), kBytes; kGlobal: "module.name"
  // kTuple, kList: the elements; kObject: the arguments (REDUCE's tuple,
  // NEWOBJ's); kPersistentId: the one id the pickle gave (BINPERSID).
  std::vector<const PickleValue*> items;
  std::vector<std::pair<const PickleValue*, const PickleValue*>> entries;  // kDict, in order
  const PickleValue* cls = nullptr;    // kObject: its class (a kGlobal)
  const PickleValue* state = nullptr;  // kObject: what BUILD gave it (often a dict), or null

  bool Is(Kind k) const { return kind == k; }
  // kDict: the value of string key `key`, or null.
  const PickleValue* Get(absl::string_view key) const;
  // kObject: its class is `name` ("module.name").
  bool IsObject(absl::string_view name) const { return kind == Kind::kObject && cls && cls->s == name; }
};

class PickleReader {
 public:
  static constexpr int64_t kMaxValues = int64_t{1} << 22;

  // `allowed`: the globals ("module.name") the pickle may name. With
  // `persistent_ids`, BINPERSID is read as a kPersistentId holding its id
  // (torch.save names its tensors' storages so); without, it is refused.
  explicit PickleReader(std::set<std::string> allowed, bool persistent_ids = false)
      : allowed_(std::move(allowed)), persistent_ids_(persistent_ids) {}
  PickleReader(const PickleReader&) = delete;
  PickleReader& operator=(const PickleReader&) = delete;

  // The value the pickle in `data` builds; owned by this reader.
  absl::StatusOr<const PickleValue*> Read(absl::string_view data, const std::string& source);

 private:
  PickleValue* New(PickleValue::Kind kind);
  std::set<std::string> allowed_;
  bool persistent_ids_ = false;
  std::vector<std::unique_ptr<PickleValue>> arena_;
};

}  // namespace shardline
