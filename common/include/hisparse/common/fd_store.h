// FdStore: the client side of a service manager's file-descriptor store, so that hisparsed keeps
// its host memory (sealed memfds) and its journal across its own restarts. The daemon hands each
// descriptor to the manager with the sd_notify protocol (sd_notify(3): FDSTORE=1, FDSTOREREMOVE=1,
// BARRIER=1, one datagram each on $NOTIFY_SOCKET); the manager keeps a reference while the daemon
// restarts and passes every stored descriptor to the next start with the sd_listen_fds protocol
// (sd_listen_fds(3): $LISTEN_PID, $LISTEN_FDS, $LISTEN_FDNAMES), which TakeListenFds reads.
//
// The manager is systemd (NotifyAccess=main, FileDescriptorStoreMax=N in the unit) or, where there
// is none (a Kubernetes container, the tests), hisparse-keeper (keeper/), which speaks the same
// protocol for one child.
//
// FdStore owns one datagram socket; it is thread-safe: each call sends one datagram, which the
// kernel delivers whole or not at all, and Barrier shares nothing between callers. A send waits at
// most 2 s for room in the manager's queue, so a wedged manager cannot hang the daemon.
// TakeListenFds reads and changes the environment: call it at start, before other threads run.
#ifndef HISPARSE_COMMON_FD_STORE_H_
#define HISPARSE_COMMON_FD_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

class FdStore {
 public:
  // The store behind $NOTIFY_SOCKET. NotFound when the variable is unset or empty (no manager
  // keeps descriptors for this process); otherwise as Connect.
  static absl::StatusOr<std::unique_ptr<FdStore>> FromEnvironment();
  // The store behind `notify_socket`: a filesystem path ("/run/systemd/notify"), or "@name" for
  // the abstract socket "\0name". Unavailable when nothing listens there, InvalidArgument for an
  // address that cannot be one.
  static absl::StatusOr<std::unique_ptr<FdStore>> Connect(const std::string& notify_socket);

  FdStore(const FdStore&) = delete;
  FdStore& operator=(const FdStore&) = delete;

  // Hands `fd` to the store under `name` ("FDSTORE=1\nFDNAME=<name>\nFDPOLL=0\n" with the fd
  // attached as SCM_RIGHTS): the store gets a reference of its own; the caller keeps `fd`. The
  // manager may refuse it silently (its store full, or none configured): only Barrier and the next
  // start's TakeListenFds tell. A name may be stored several times; each fd comes back.
  absl::Status Put(absl::string_view name, int fd);
  // Drops every descriptor stored under `name` ("FDSTOREREMOVE=1\nFDNAME=<name>\n").
  absl::Status Remove(absl::string_view name);
  // Waits up to `timeout` until the manager has processed every message this process sent before
  // (sd_notify_barrier): sends "BARRIER=1\n" with the write end of a fresh pipe, closes its own
  // copy and waits for the read end to hang up, which it does when the manager closes the one it
  // got. DeadlineExceeded when it did not within `timeout`.
  absl::Status Barrier(absl::Duration timeout = absl::Seconds(5));

  // The address as given ("@name" for an abstract socket).
  const std::string& address() const { return address_; }

 private:
  FdStore(UniqueFd sock, std::string address) : sock_(std::move(sock)), address_(std::move(address)) {}
  absl::Status Send(absl::string_view what, absl::string_view payload, int fd_to_pass);

  const UniqueFd sock_;
  const std::string address_;
};

// Whether `name` may name a stored descriptor: 1..255 printable ASCII characters (' ' to '~'),
// none of them ':' (the separator of $LISTEN_FDNAMES). Put and Remove refuse any other name with
// InvalidArgument; hisparse-keeper refuses it too.
bool IsValidFdName(absl::string_view name);

// One descriptor the manager passed at start, with the name it was stored under ("unknown" when
// the manager gave none).
struct ListenFd {
  std::string name;
  UniqueFd fd;
};

// The descriptors the manager passed to this process (sd_listen_fds_with_names semantics):
// $LISTEN_PID must be this process's pid, $LISTEN_FDS=n means descriptors 3..3+n-1, and
// $LISTEN_FDNAMES, when set, names them in order, ':'-separated (an empty field, or the variable
// unset, reads "unknown"). Takes ownership of each descriptor and sets FD_CLOEXEC on it, so that
// none leaks into a process this one starts. Empty when $LISTEN_PID is unset or another process's
// (the variables were inherited, not meant for us). InvalidArgument for a value that does not
// parse, or when $LISTEN_FDNAMES names more or fewer descriptors than $LISTEN_FDS;
// FailedPrecondition when one of 3..3+n-1 is not open (nothing is taken then). Unsets the three
// variables in every case, so that a child of this process never takes them for its own.
absl::StatusOr<std::vector<ListenFd>> TakeListenFds();

}  // namespace hisparse

#endif  // HISPARSE_COMMON_FD_STORE_H_
