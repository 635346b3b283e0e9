// Status propagation helpers (Abseil ships none publicly).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TOST_STATUS_CONCAT_INNER(a, b) a##b
#define TOST_STATUS_CONCAT(a, b) TOST_STATUS_CONCAT_INNER(a, b)

#define TOST_RETURN_IF_ERROR(expr)                \
  do {                                            \
    if (::absl::Status _st = (expr); !_st.ok()) { \
      return _st;                                 \
    }                                             \
  } while (false)

#define TOST_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

#define TOST_ASSIGN_OR_RETURN(lhs, expr) \
  TOST_ASSIGN_OR_RETURN_IMPL(TOST_STATUS_CONCAT(_statusor_, __LINE__), lhs, expr)
