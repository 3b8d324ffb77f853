#include "hisparse/common/socket_access.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hisparse {
namespace {

// connect()'s errno for a stream socket at `path` (0: it connected, and was closed at once).
int ConnectErrno(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return ENAMETOOLONG;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

std::string GroupName(gid_t gid) {
  std::vector<char> buf(16384);
  group g{};
  group* found = nullptr;
  if (::getgrgid_r(gid, &g, buf.data(), buf.size(), &found) == 0 && found != nullptr) return found->gr_name;
  return absl::StrCat(gid);
}

// The permission message for `path`: the first directory on the way this process may not search,
// or else the socket itself.
std::string PermissionMessage(const std::string& path) {
  std::string denied = path;
  std::string what = "the socket";
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    const std::string dir = path.substr(0, slash);
    if (::faccessat(AT_FDCWD, dir.c_str(), X_OK, AT_EACCESS) != 0 && errno == EACCES) {
      denied = dir;
      what = "the socket's directory";
      break;
    }
  }
  struct stat st {};
  if (::stat(denied.c_str(), &st) != 0) {
    return absl::StrCat("permission denied on ", what, " ", denied,
                        ": this user may not open it; run as a member of the daemon's group (access.socket_group)");
  }
  const std::string group = GroupName(st.st_gid);
  return absl::StrFormat(
      "permission denied on %s %s (mode %04o, group %s): add the user to that group (usermod -aG %s USER, "
      "then log in again), or run as a member of it",
      what, denied, st.st_mode & 07777, group, group);
}

bool UnixPath(absl::string_view address, std::string* path) {
  if (!absl::StartsWith(address, "unix:")) return false;
  *path = std::string(address.substr(5));
  return !path->empty();
}

}  // namespace

absl::Status CheckSocketAccess(absl::string_view address) {
  std::string path;
  if (!UnixPath(address, &path)) return absl::OkStatus();
  // A look first, so that the usual case opens no connection to the daemon; then connect() says
  // whether the kernel really refuses (a refused connect never reaches the listener).
  if (::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) == 0 || errno != EACCES) return absl::OkStatus();
  if (ConnectErrno(path) != EACCES) return absl::OkStatus();
  return absl::PermissionDeniedError(PermissionMessage(path));
}

std::string DescribeUnreachableSocket(absl::string_view address) {
  std::string path;
  if (!UnixPath(address, &path)) return "";
  switch (const int err = ConnectErrno(path)) {
    case 0:
      return "";
    case EACCES:
      return PermissionMessage(path);
    case ENOENT:
      return absl::StrCat("no socket at ", path, ": is hisparsed running, with this listen address?");
    case ECONNREFUSED:
      return absl::StrCat("nothing listens at ", path, ": hisparsed is not running (the socket file is left over)");
    default:
      return absl::StrCat("connect to ", path, ": ", std::strerror(err));
  }
}

}  // namespace hisparse
