#include "client_version.h"

#include "hisparse/common/version.h"

// Defined only by tests/integration's version clients (client_version.h says why).
#ifndef HISPARSE_CLIENT_REPORTED_VERSION
#define HISPARSE_CLIENT_REPORTED_VERSION HISPARSE_VERSION
#endif

namespace hisparse {

const char* ClientReportedVersion() { return HISPARSE_CLIENT_REPORTED_VERSION; }

}  // namespace hisparse
