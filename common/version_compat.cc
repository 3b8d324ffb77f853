#include "hisparse/common/version_compat.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace hisparse {

absl::StatusOr<SemVer> ParseSemVer(absl::string_view text) {
  absl::string_view core = text.substr(0, text.find_first_of("-+"));
  std::vector<absl::string_view> parts = absl::StrSplit(core, '.');
  SemVer v;
  uint32_t* fields[] = {&v.major, &v.minor, &v.patch};
  bool ok = parts.size() == 3;
  for (size_t i = 0; ok && i < 3; ++i) {
    ok = !parts[i].empty() && parts[i].find_first_not_of("0123456789") == absl::string_view::npos &&
         absl::SimpleAtoi(parts[i], fields[i]);
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("version \"", text.substr(0, 64), "\" is not MAJOR.MINOR.PATCH (semantic versioning)"));
  }
  return v;
}

absl::Status CheckClientVersion(absl::string_view client_version, absl::string_view daemon_version) {
  if (client_version.empty()) return absl::OkStatus();
  absl::StatusOr<SemVer> client = ParseSemVer(client_version);
  if (!client.ok()) return absl::InvalidArgumentError(absl::StrCat("client_version: ", client.status().message()));
  absl::StatusOr<SemVer> daemon = ParseSemVer(daemon_version);
  if (!daemon.ok()) return absl::InternalError(absl::StrCat("the daemon's own ", daemon.status().message()));
  if (client->major == daemon->major && client->minor <= daemon->minor) return absl::OkStatus();
  const char* why = client->major != daemon->major ? "another major version: no daemon serves a client of another major"
                                                   : "a newer minor version than the daemon: upgrade the daemon first";
  return absl::FailedPreconditionError(absl::StrCat("client hisparse ", client_version, " is ", why,
                                                    " (daemon hisparse ", daemon_version, " serves clients ",
                                                    daemon->major, ".0 to ", daemon->major, ".", daemon->minor, ")"));
}

}  // namespace hisparse
