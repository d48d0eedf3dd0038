#include "common/checkpoint/pickle_reader.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/quoted.h"

namespace shardline {

const PickleValue* PickleValue::Get(absl::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::kString && k->s == key) return v;
  }
  return nullptr;
}

PickleValue* PickleReader::New(PickleValue::Kind kind) {
  arena_.push_back(std::make_unique<PickleValue>());
  arena_.back()->kind = kind;
  return arena_.back().get();
}

namespace {

using Kind = PickleValue::Kind;

// The input and a position in it; every read is checked against the end.
class Cursor {
 public:
  explicit Cursor(absl::string_view data) : data_(data) {}
  size_t pos() const { return pos_; }
  bool done() const { return pos_ >= data_.size(); }
  bool Take(size_t n, absl::string_view* out) {
    if (n > data_.size() - pos_) return false;
    *out = data_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  // An unsigned little-endian integer of n <= 8 bytes.
  bool Uint(size_t n, uint64_t* v) {
    absl::string_view b;
    if (!Take(n, &b)) return false;
    *v = 0;
    for (size_t k = 0; k < n; ++k) *v |= uint64_t{static_cast<uint8_t>(b[k])} << (8 * k);
    return true;
  }
  bool Line(absl::string_view* out) {
    const size_t end = data_.find('\n', pos_);
    if (end == absl::string_view::npos) return false;
    *out = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return true;
  }

 private:
  absl::string_view data_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<const PickleValue*> PickleReader::Read(absl::string_view data, const std::string& source) {
  Cursor in(data);
  std::vector<PickleValue*> stack;
  std::vector<size_t> marks;  // stack sizes at each open MARK
  std::vector<PickleValue*> memo;
  int64_t copied = 0;  // argument pointers REDUCE and NEWOBJ copied, charged to kMaxValues
  size_t at = 0;       // the opcode's offset, for errors
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": pickle at byte ", at, ": ", what));
  };
  auto refused_opcode = [&](uint8_t op) {
    return bad(absl::StrCat("opcode 0x", absl::Hex(op), " is not in the subset this reader runs"));
  };
  auto push = [&](PickleValue* v) { stack.push_back(v); };
  auto make = [&](Kind k) -> PickleValue* { return arena_.size() < kMaxValues ? New(k) : nullptr; };
  // The values above the last MARK, which is closed.
  auto pop_mark = [&](std::vector<PickleValue*>* out) {
    if (marks.empty() || marks.back() > stack.size()) return false;
    out->assign(stack.begin() + static_cast<std::ptrdiff_t>(marks.back()), stack.end());
    stack.resize(marks.back());
    marks.pop_back();
    return true;
  };
  auto pop = [&](PickleValue** v) {
    if (stack.empty() || (!marks.empty() && marks.back() == stack.size())) return false;
    *v = stack.back();
    stack.pop_back();
    return true;
  };
  auto text = [&](size_t len_bytes, Kind kind) -> absl::Status {
    uint64_t n;
    absl::string_view s;
    if (!in.Uint(len_bytes, &n) || n > data.size() || !in.Take(static_cast<size_t>(n), &s)) return bad("truncated");
    PickleValue* v = make(kind);
    if (!v) return bad("too many values");
    v->s = std::string(s);
    push(v);
    return absl::OkStatus();
  };
  auto global = [&](const std::string& name) -> absl::Status {
    if (!allowed_.count(name)) {
      return bad(absl::StrCat("refused global ", Shown(name, 256), " (not a class this reader knows)"));
    }
    PickleValue* v = make(Kind::kGlobal);
    if (!v) return bad("too many values");
    v->s = name;
    push(v);
    return absl::OkStatus();
  };

  while (true) {
    if (stack.size() > static_cast<size_t>(kMaxValues) || marks.size() > static_cast<size_t>(kMaxValues)) {
      return bad("too deep a stack");
    }
    at = in.pos();
    absl::string_view op_byte;
    if (!in.Take(1, &op_byte)) return bad("truncated: no STOP");
    const uint8_t op = static_cast<uint8_t>(op_byte[0]);
    uint64_t n = 0;
    absl::string_view raw;
    PickleValue* a = nullptr;
    PickleValue* b = nullptr;
    std::vector<PickleValue*> items;
    switch (op) {
      case 0x80:  // PROTO
        if (!in.Uint(1, &n) || n < 2 || n > 5) return bad("protocol not in 2..5");
        break;
      case 0x95:  // FRAME: a length hint
        if (!in.Uint(8, &n)) return bad("truncated");
        break;
      case '.':  // STOP
        if (stack.size() != 1 || !marks.empty()) return bad("STOP with a stack of other than one value");
        return stack.back();
      case '(':  // MARK
        marks.push_back(stack.size());
        break;
      case '0':  // POP
        if (!pop(&a)) return bad("POP of an empty stack");
        break;
      case '1':  // POP_MARK
        if (!pop_mark(&items)) return bad("POP_MARK without a MARK");
        break;
      case 'N':
      case 0x88:
      case 0x89: {  // NONE, NEWTRUE, NEWFALSE
        PickleValue* v = make(op == 'N' ? Kind::kNone : Kind::kBool);
        if (!v) return bad("too many values");
        v->b = op == 0x88;
        push(v);
        break;
      }
      case 'J':     // BININT
      case 'K':     // BININT1
      case 'M':     // BININT2
      case 0x8a: {  // LONG1
        size_t width = op == 'J' ? 4 : op == 'K' ? 1 : op == 'M' ? 2 : 0;
        if (op == 0x8a) {
          if (!in.Uint(1, &n) || n > 8) return bad("LONG1 wider than 8 bytes");
          width = static_cast<size_t>(n);
        }
        uint64_t u = 0;
        if (!in.Uint(width, &u)) return bad("truncated");
        int64_t v = static_cast<int64_t>(u);
        const bool is_signed = op == 'J' || op == 0x8a;
        if (is_signed && width > 0 && width < 8 && (u >> (8 * width - 1)) & 1) v -= int64_t{1} << (8 * width);
        PickleValue* pv = make(Kind::kInt);
        if (!pv) return bad("too many values");
        pv->i = v;
        push(pv);
        break;
      }
      case 'G': {  // BINFLOAT: big-endian IEEE 754 double
        if (!in.Take(8, &raw)) return bad("truncated");
        uint64_t u = 0;
        for (char c : raw) u = (u << 8) | static_cast<uint8_t>(c);
        PickleValue* v = make(Kind::kFloat);
        if (!v) return bad("too many values");
        std::memcpy(&v->f, &u, sizeof(u));
        push(v);
        break;
      }
      case 'X':     // BINUNICODE
      case 0x8c:    // SHORT_BINUNICODE
      case 0x8d:    // BINUNICODE8
      case 'B':     // BINBYTES
      case 'C':     // SHORT_BINBYTES
      case 0x8e: {  // BINBYTES8: a length of 1, 4 or 8 bytes, then the text
        const size_t width = op == 0x8c || op == 'C' ? 1 : op == 'X' || op == 'B' ? 4 : 8;
        if (absl::Status s = text(width, op == 'X' || op == 0x8c || op == 0x8d ? Kind::kString : Kind::kBytes);
            !s.ok()) {
          return s;
        }
        break;
      }
      case ')':     // EMPTY_TUPLE
      case ']':     // EMPTY_LIST
      case '}': {   // EMPTY_DICT
        PickleValue* v = make(op == ')' ? Kind::kTuple : op == ']' ? Kind::kList : Kind::kDict);
        if (!v) return bad("too many values");
        push(v);
        break;
      }
      case 't':     // TUPLE
      case 0x85:    // TUPLE1
      case 0x86:    // TUPLE2
      case 0x87: {  // TUPLE3
        if (op == 't') {
          if (!pop_mark(&items)) return bad("TUPLE without a MARK");
        } else {
          const size_t k = op - 0x84;
          for (size_t j = 0; j < k; ++j) {
            if (!pop(&a)) return bad("TUPLE of too few values");
            items.insert(items.begin(), a);
          }
        }
        PickleValue* v = make(Kind::kTuple);
        if (!v) return bad("too many values");
        v->items.assign(items.begin(), items.end());
        push(v);
        break;
      }
      case 'a':  // APPEND
        if (!pop(&a) || stack.empty() || !stack.back()->Is(Kind::kList)) return bad("APPEND to no list");
        stack.back()->items.push_back(a);
        break;
      case 'e':  // APPENDS
        if (!pop_mark(&items) || stack.empty() || !stack.back()->Is(Kind::kList)) return bad("APPENDS to no list");
        stack.back()->items.insert(stack.back()->items.end(), items.begin(), items.end());
        break;
      case 's':  // SETITEM
        if (!pop(&b) || !pop(&a) || stack.empty() || !stack.back()->Is(Kind::kDict)) return bad("SETITEM to no dict");
        stack.back()->entries.emplace_back(a, b);
        break;
      case 'u':  // SETITEMS
        if (!pop_mark(&items) || items.size() % 2 || stack.empty() || !stack.back()->Is(Kind::kDict)) {
          return bad("SETITEMS to no dict, or of an odd number of values");
        }
        for (size_t j = 0; j < items.size(); j += 2) stack.back()->entries.emplace_back(items[j], items[j + 1]);
        break;
      case 0x94:  // MEMOIZE
        if (stack.empty()) return bad("MEMOIZE of an empty stack");
        memo.push_back(stack.back());
        break;
      case 'q':    // BINPUT
      case 'r':    // LONG_BINPUT
      case 'h':    // BINGET
      case 'j': {  // LONG_BINGET
        if (!in.Uint(op == 'q' || op == 'h' ? 1 : 4, &n)) return bad("truncated");
        if (n >= static_cast<uint64_t>(kMaxValues)) return bad("memo index out of bounds");
        if (op == 'q' || op == 'r') {
          if (stack.empty()) return bad("BINPUT of an empty stack");
          if (memo.size() <= n) memo.resize(n + 1, nullptr);
          memo[n] = stack.back();
        } else {
          if (n >= memo.size() || !memo[n]) return bad(absl::StrCat("memo entry ", n, " was never stored"));
          push(memo[n]);
        }
        break;
      }
      case 'c': {  // GLOBAL: "module\nname\n"
        absl::string_view module, name;
        if (!in.Line(&module) || !in.Line(&name)) return bad("truncated GLOBAL");
        if (absl::Status s = global(absl::StrCat(module, ".", name)); !s.ok()) return s;
        break;
      }
      case 0x93:  // STACK_GLOBAL
        if (!pop(&b) || !pop(&a) || !a->Is(Kind::kString) || !b->Is(Kind::kString)) {
          return bad("STACK_GLOBAL of other than two strings");
        }
        if (absl::Status s = global(absl::StrCat(a->s, ".", b->s)); !s.ok()) return s;
        break;
      case 'R':     // REDUCE: cls(*args)
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        if (!pop(&b) || !pop(&a) || !a->Is(Kind::kGlobal) || !b->Is(Kind::kTuple)) {
          return bad("REDUCE or NEWOBJ of other than a global and a tuple");
        }
        // The arguments are copied: a memoized tuple reduced again and again
        // would otherwise copy more than any bound on values holds.
        copied += static_cast<int64_t>(b->items.size());
        PickleValue* v = copied <= kMaxValues ? make(Kind::kObject) : nullptr;
        if (!v) return bad("too many values");
        v->cls = a;
        v->items = b->items;
        push(v);
        break;
      }
      case 'b':  // BUILD: obj.__setstate__(state)
        if (!pop(&b) || stack.empty() || !stack.back()->Is(Kind::kObject) || stack.back()->state) {
          return bad("BUILD of no object, or of one built already");
        }
        stack.back()->state = b;
        break;
      case 'Q': {  // BINPERSID: persistent_load(pid), where the caller allows it
        if (!persistent_ids_) return refused_opcode(op);
        if (!pop(&a)) return bad("BINPERSID of nothing");
        PickleValue* v = make(Kind::kPersistentId);
        if (!v) return bad("too many values");
        v->items = {a};
        push(v);
        break;
      }
      default:
        return refused_opcode(op);
    }
  }
}

}  // namespace shardline
