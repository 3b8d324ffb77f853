// Which client releases a daemon serves: the rule both sides of OpenSession follow.
//
// Versions are semantic (MAJOR.MINOR.PATCH, CMakeLists.txt's project(VERSION)); the client sends
// its own at OpenSession (OpenSession.client_version). A daemon serves a client of its own major
// whose minor is at most its own: it keeps every call an older minor of its major knew, so a node
// may upgrade the daemon before the engines. It refuses a newer minor (which may send what it
// does not know) and another major, with FAILED_PRECONDITION naming both versions. A client that
// sends no version predates the rule (0.1.0 and older) and is served.
//
// Pure functions; thread-safe.
#ifndef HISPARSE_COMMON_VERSION_COMPAT_H_
#define HISPARSE_COMMON_VERSION_COMPAT_H_

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hisparse {

struct SemVer {
  uint32_t major = 0;
  uint32_t minor = 0;
  uint32_t patch = 0;
};

// "MAJOR.MINOR.PATCH", each a decimal number; a "-suffix" or "+suffix" after PATCH is allowed and
// ignored. Anything else: INVALID_ARGUMENT saying what was wrong.
absl::StatusOr<SemVer> ParseSemVer(absl::string_view text);

// OK when a daemon of `daemon_version` serves a client of `client_version` (the rule above);
// empty `client_version`: OK. A malformed client version: INVALID_ARGUMENT.
absl::Status CheckClientVersion(absl::string_view client_version, absl::string_view daemon_version);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_VERSION_COMPAT_H_
