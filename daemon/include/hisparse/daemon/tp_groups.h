// TpGroups: the node's tensor-parallel groups (docs/DESIGN.md, "TP groups"; GroupRequests,
// group_requests.h, admits, extends and releases group requests in the pool).
//
// A group is sessions of one tenant, one per rank, whose group requests share one set of host
// pages. It lives while a member does. Groups are their tenant's: named by (tenant uid, name), so
// another uid cannot take, or even see, the name a tenant's TP engine will use. This class holds
// the groups and their membership: the checks of OpenSession.group, joining and leaving a rank,
// and what the listing says of a group request.
//
// Not thread-safe: SessionManager calls it under its mutex.
#ifndef HISPARSE_DAEMON_TP_GROUPS_H_
#define HISPARSE_DAEMON_TP_GROUPS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/request_table.h"
#include "hisparse/daemon/session_entry.h"
#include "hisparse/v1/hisparse.pb.h"

namespace hisparse {

struct TpGroup {
  // The pool owner of the group's pages: an id of the session counter, so never a session's.
  uint64_t owner = 0;
  uint32_t tenant_uid = 0;
  // What every member's geometry must match: the pages' layout and page-table stride.
  uint32_t num_layers = 0, record_bytes = 0, max_context_tokens = 0;
  std::vector<uint64_t> ranks;  // rank -> session id, 0: no live session holds it
  struct Held {
    // Member sessions holding a share (a row), in the order they took it; the first is charged
    // for the pages (its RequestEntry::charged_pages, the ledger's count), the others 0.
    std::vector<uint64_t> holders;
    std::vector<std::vector<PagePool::Page>> pages;  // per layer; one reference per holder
  };
  std::map<uint64_t, Held> requests;  // by request id
};

class TpGroups {
 public:
  using Key = std::pair<uint32_t, std::string>;  // (tenant uid, name)
  using Map = std::map<Key, TpGroup>;
  static Key KeyOf(const SessionEntry& s) { return {s.tenant_uid, s.group}; }

  // INVALID_ARGUMENT for a malformed OpenSession.group.
  static absl::Status Validate(const v1::TpGroup& g);
  // Whether `s` (geometry and tenant set, max context `max_context`) may take its rank of group
  // `g`: the codes of OpenSession.group. Join checks it again and joins, creating the group for
  // its first member with its pool owner taken from `*next_id` (the session counter).
  absl::Status CheckJoin(const SessionEntry& s, const v1::TpGroup& g, uint32_t max_context) const;
  absl::Status Join(SessionEntry& s, const v1::TpGroup& g, uint32_t max_context, uint64_t* next_id);
  // Frees `s`'s rank; with the last member the group ends, and its pool owner is returned for the
  // caller to retire its idle slabs.
  std::optional<uint64_t> Leave(const SessionEntry& s);

  // The group of `s` (a member), or null.
  TpGroup* Find(const SessionEntry& s);
  const TpGroup* Find(const SessionEntry& s) const;
  const Map& all() const { return groups_; }
  bool IsOwner(uint64_t owner) const;
  // ListRequests' group fields of `s`'s share `r` (info->host_bytes set already).
  void FillInfo(const SessionEntry& s, const RequestEntry& r, v1::RequestInfo* info) const;

 private:
  Map groups_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_TP_GROUPS_H_
