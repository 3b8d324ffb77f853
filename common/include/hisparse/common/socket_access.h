// Socket access: tells "this user may not open the daemon's socket" apart from "the daemon is not
// there", at once, for the client library and hisparse-ctl.
//
// hisparsed's sockets are mode 0660 in the group access.socket_group, in a directory that may be
// closed to others too (/run/hisparse, 0750). A caller outside that group gets EACCES from
// connect(), which gRPC retries like any failed connect until its deadline, and then reports as
// UNAVAILABLE. CheckSocketAccess looks first, without connecting (a probe connection would reach
// the daemon as a client), and names the file, its mode and group, and the fix. Free functions;
// thread-safe.
#ifndef HISPARSE_COMMON_SOCKET_ACCESS_H_
#define HISPARSE_COMMON_SOCKET_ACCESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hisparse {

// For a "unix:PATH" address: PermissionDenied when this process (its effective uid, gid and
// supplementary groups) may not connect to PATH, because PATH or a directory on the way denies
// it, confirmed by a connect() that fails with EACCES (a denied connect never reaches the
// daemon). The message is "permission denied on the socket PATH (mode 0660, group G): add the user
// to that group ..." or names the directory that denies. Ok otherwise, also for other addresses,
// and when PATH does not exist or nothing listens (the caller's own wait decides those).
absl::Status CheckSocketAccess(absl::string_view address);

// Why "unix:PATH" cannot be reached now, for a message after a failed wait: the permission
// problem above, "no socket at PATH", or "nothing listens at PATH". Empty when connect() works
// (the daemon is there but did not answer in time) or the address is not unix:.
std::string DescribeUnreachableSocket(absl::string_view address);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_SOCKET_ACCESS_H_
