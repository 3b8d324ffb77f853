// Small local equivalents of ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN, which Debian's Abseil
// (20220623) lacks.
#ifndef HISPARSE_COMMON_STATUS_MACROS_H_
#define HISPARSE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HS_CONCAT_INNER_(a, b) a##b
#define HS_CONCAT_(a, b) HS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define HS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status hs_status_ = (expr);      \
    if (!hs_status_.ok()) return hs_status_; \
  } while (0)

// `lhs = value of expr`, or returns its error status from the enclosing function.
#define HS_ASSIGN_OR_RETURN(lhs, expr) HS_ASSIGN_OR_RETURN_IMPL_(HS_CONCAT_(hs_statusor_, __LINE__), lhs, expr)
// NOLINTBEGIN(bugprone-macro-parentheses): `lhs` is a declaration and cannot be parenthesized.
#define HS_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                              \
  if (!var.ok()) return var.status();             \
  lhs = std::move(var).value()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // HISPARSE_COMMON_STATUS_MACROS_H_
