// Local stand-ins for ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN, which the
// pinned Abseil LTS (20220623) does not have.
//
//   TRAFFICRATE_RETURN_IF_ERROR(zone.Validate());
//   TRAFFICRATE_ASSIGN_OR_RETURN(uint64_t rate, ParseRate(text));

#ifndef TRAFFICRATE_SRC_BASE_STATUS_MACROS_H_
#define TRAFFICRATE_SRC_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TRAFFICRATE_RETURN_IF_ERROR(expr)                      \
  do {                                                         \
    const ::absl::Status trafficrate_status_ = (expr);         \
    if (!trafficrate_status_.ok()) return trafficrate_status_; \
  } while (0)

#define TRAFFICRATE_STATUS_CONCAT_INNER_(a, b) a##b
#define TRAFFICRATE_STATUS_CONCAT_(a, b) TRAFFICRATE_STATUS_CONCAT_INNER_(a, b)

#define TRAFFICRATE_ASSIGN_OR_RETURN(lhs, expr) \
  TRAFFICRATE_ASSIGN_OR_RETURN_IMPL_(           \
      TRAFFICRATE_STATUS_CONCAT_(trafficrate_statusor_, __LINE__), lhs, expr)

#define TRAFFICRATE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                       \
  if (!statusor.ok()) return std::move(statusor).status();      \
  lhs = std::move(statusor).value()

#endif  // TRAFFICRATE_SRC_BASE_STATUS_MACROS_H_
