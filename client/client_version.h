// The release a client reports at OpenSession (OpenSession.client_version), which the daemon holds
// to its own (hisparse/common/version_compat.h).
//
// Alone in client_version.cc, kept out of unity batches, so that a test client can be built
// reporting another release: tests/integration's version clients compile that file with
// HISPARSE_CLIENT_REPORTED_VERSION set and link it ahead of the client's archive, whose own copy
// then goes unused. Everything else is this build's code.
#ifndef HISPARSE_CLIENT_CLIENT_VERSION_H_
#define HISPARSE_CLIENT_CLIENT_VERSION_H_

namespace hisparse {

// HISPARSE_VERSION (CMakeLists.txt's project(VERSION)) in every product build.
const char* ClientReportedVersion();

}  // namespace hisparse

#endif  // HISPARSE_CLIENT_CLIENT_VERSION_H_
