// hisparse-ctl groups: the node's TP groups (docs/DESIGN.md, "TP groups"): each group's ranks and
// the sessions holding them, its requests, the shares (rows) its ranks hold of them, and its host
// bytes, counted once however many ranks read them. A tenant sees its own groups.
#include <cstdio>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_join.h"
#include "ctl.h"
#include "hisparse/common/size_parse.h"

namespace hisparse::ctl {
namespace {

// "3,4,-,6": each rank's session id, "-" for a rank no live session holds.
std::string RankSessions(const v1::GroupStats& g) {
  std::vector<std::string> parts;
  for (uint64_t id : g.rank_sessions()) parts.push_back(id == 0 ? "-" : std::to_string(id));
  return absl::StrJoin(parts, ",");
}

}  // namespace

int GroupsCommand(const GlobalOptions& g, const CommandOptions&) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  v1::StatsResponse resp;
  grpc::Status st = stub->Stats(Context(g).get(), v1::StatsRequest(), &resp);
  if (!st.ok()) return ReportRpcError(st, "groups");
  if (g.json) {
    std::printf("[");
    for (int i = 0; i < resp.groups_size(); ++i) {
      const auto& gs = resp.groups(i);
      std::printf(
          "%s\n {\"name\": %s, \"size\": %u, \"rank_sessions\": [%s], \"requests\": %u, \"shares\": %u, "
          "\"host_bytes\": %lu, \"slabs\": %u}",
          i ? "," : "", JsonString(gs.name()).c_str(), gs.size(), absl::StrJoin(gs.rank_sessions(), ", ").c_str(),
          gs.requests(), gs.shares(), gs.host_bytes(), gs.slabs());
    }
    std::printf("%s]\n", resp.groups_size() ? "\n" : "");
    return kExitOk;
  }
  std::printf("%-24s %5s %-24s %9s %7s %11s %6s\n", "GROUP", "SIZE", "RANK SESSIONS", "REQUESTS", "SHARES", "HOST",
              "SLABS");
  for (const auto& gs : resp.groups()) {
    std::printf("%-24s %5u %-24s %9u %7u %11s %6u\n", gs.name().substr(0, 24).c_str(), gs.size(),
                RankSessions(gs).substr(0, 24).c_str(), gs.requests(), gs.shares(),
                FormatByteSize(gs.host_bytes()).c_str(), gs.slabs());
  }
  if (resp.groups_size() == 0) std::printf("(no groups)\n");
  return kExitOk;
}

}  // namespace hisparse::ctl
