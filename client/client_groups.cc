// ClientSession's TP groups: see client_session.h and docs/DESIGN.md, "TP groups". The group's
// pages reach this process as any request's: the daemon's answer names their slabs, which the fd
// channel hands to a member of the group (the slabs are the group's, not this session's).
#include "absl/status/status.h"
#include "client_session.h"
#include "hisparse/common/status_macros.h"

namespace hisparse {

void ClientSession::SetGroup(const hs_session_options& o) {
  if (o.group == nullptr) return;  // NULL before ABI 1.7
  v1::TpGroup g;
  g.set_name(o.group);
  g.set_rank(o.group_rank);
  g.set_size(o.group_size);
  group_ = std::move(g);  // the daemon validates it (OpenSession.group)
}

}  // namespace hisparse
