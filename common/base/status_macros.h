// Status helpers shared by every program. absl::Status / StatusOr are used
// everywhere inside Shardline; they are mapped to grpc::Status only at the
// service boundary.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SL_CONCAT_INNER(a, b) a##b
#define SL_CONCAT(a, b) SL_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define SL_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status _sl_status = (expr);           \
    if (!_sl_status.ok()) return _sl_status;      \
  } while (0)

// `SL_ASSIGN_OR_RETURN(auto x, MakeX());` unwraps a StatusOr or returns its error.
#define SL_ASSIGN_OR_RETURN(lhs, rexpr) \
  SL_ASSIGN_OR_RETURN_IMPL(SL_CONCAT(_sl_statusor_, __LINE__), lhs, rexpr)
#define SL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                             \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
