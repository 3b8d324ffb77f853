// The service manager's side of the fd-store protocol, as pure pieces hisparse-keeper is built
// from: what one notify message asks for (ParseNotifyMessage), and the store itself (StoredFds).
// The client side is hisparse/common/fd_store.h; the loop that joins them is keeper.h.
#ifndef HISPARSE_KEEPER_NOTIFY_PROTOCOL_H_
#define HISPARSE_KEEPER_NOTIFY_PROTOCOL_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

// What one datagram on the notify socket asks for. The message is "KEY=VALUE" lines, each ended by
// '\n' (the last one may lack it); the keys below count only with the value "1"; a key given twice
// keeps its last value; a line without '=' and every other key (READY=1, STATUS=..., FDPOLL=0, ...)
// is ignored.
struct NotifyMessage {
  bool fdstore = false;         // FDSTORE=1: store the message's descriptors under fdname
  bool fdstore_remove = false;  // FDSTOREREMOVE=1: drop every descriptor stored under fdname
  bool barrier = false;         // BARRIER=1: close the message's descriptor once it is processed
  std::string fdname;           // FDNAME=...; empty when the message has none
};
NotifyMessage ParseNotifyMessage(absl::string_view message);

// The name a descriptor is stored under when its message gives no FDNAME (systemd's default).
inline constexpr char kDefaultFdName[] = "stored";

// StoredFds: the descriptors the manager keeps for its child, in the order they were stored, each
// under a name; a name may be stored several times (each descriptor is kept, as systemd keeps
// them). Owns every descriptor it holds, and holds at most max_fds of them. Move-only, one owner,
// not thread-safe.
class StoredFds {
 public:
  explicit StoredFds(size_t max_fds) : max_fds_(max_fds) {}

  // Appends `fd` under `name`. ResourceExhausted, closing `fd`, when max_fds are held already.
  absl::Status Add(std::string name, UniqueFd fd);
  // Closes and drops every descriptor stored under `name`; how many there were.
  size_t Remove(absl::string_view name);
  // Closes and drops every descriptor.
  void Clear() { entries_.clear(); }

  size_t count() const { return entries_.size(); }
  size_t count(absl::string_view name) const;
  size_t max_fds() const { return max_fds_; }
  // The names and the descriptors, in the order they were stored (the order they are passed in).
  std::vector<std::string> names() const;
  std::vector<int> fds() const;

 private:
  struct Entry {
    std::string name;
    UniqueFd fd;
  };
  size_t max_fds_;
  std::vector<Entry> entries_;
};

}  // namespace hisparse

#endif  // HISPARSE_KEEPER_NOTIFY_PROTOCOL_H_
