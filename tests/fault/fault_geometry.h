// The small host-backend session both fd-channel fault tests open: 2 layers of 64-B records, k 4,
// 8 slots, 2 requests. The options borrow `address` and `engine` (they must outlive the open).
#ifndef HISPARSE_TESTS_FAULT_FAULT_GEOMETRY_H_
#define HISPARSE_TESTS_FAULT_FAULT_GEOMETRY_H_

#include <cstdint>
#include <string>

#include "hisparse/hisparse.h"

namespace hisparse {

inline hs_session_options FaultGeometry(const std::string& address, const char* engine, uint32_t timeout_ms = 0) {
  hs_session_options o = HS_SESSION_OPTIONS_INIT;
  o.daemon_address = address.c_str();
  o.engine_name = engine;
  o.num_layers = 2;
  o.record_bytes = 64;
  o.k = 4;
  o.slots = 8;
  o.max_requests = 2;
  o.backend = HS_BACKEND_HOST;
  o.timeout_ms = timeout_ms;
  return o;
}

}  // namespace hisparse

#endif  // HISPARSE_TESTS_FAULT_FAULT_GEOMETRY_H_
