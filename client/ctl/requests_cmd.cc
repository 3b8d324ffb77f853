// hisparse-ctl requests [--session ID]: every admitted request (live or parked, durable with the
// lease left, the bytes it shares with another request, and its TP group with the ranks holding
// it), orphaned durable requests of ended sessions, or one session's, following the daemon's pages
// to the end.
#include <cstdio>
#include <string>

#include <grpcpp/grpcpp.h>

#include "ctl.h"
#include "hisparse/common/size_parse.h"

namespace hisparse::ctl {
namespace {

// The state: live (holds an arena row), parked (host pages only), or orphaned (durable, its
// session ended: parked until adopted or its lease ends).
const char* StateName(v1::RequestState state) {
  switch (state) {
    case v1::REQUEST_STATE_PARKED:
      return "parked";
    case v1::REQUEST_STATE_ORPHANED:
      return "orphaned";
    case v1::REQUEST_STATE_IMPORTING:
      return "importing";
    default:
      return "live";
  }
}

// The table's state column: the state, and for a durable request the lease left ("live,durable
// 53s", "orphaned 53s": an orphan is always durable).
std::string StateColumn(const v1::RequestInfo& r) {
  std::string out = StateName(r.state());
  if (!r.durable()) return out;
  if (r.state() != v1::REQUEST_STATE_ORPHANED) out += ",durable";
  char left[32];
  std::snprintf(left, sizeof(left), " %.0fs", r.lease_seconds_left());
  return out + left;
}

}  // namespace

int RequestsCommand(const GlobalOptions& g, const CommandOptions& o) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  v1::ListRequestsRequest req;
  req.set_session_id(o.session);
  v1::ListRequestsResponse resp;
  for (;;) {
    v1::ListRequestsResponse page;
    grpc::Status st = stub->ListRequests(Context(g).get(), req, &page);
    if (!st.ok()) return ReportRpcError(st, "requests");
    for (auto& r : *page.mutable_requests()) *resp.add_requests() = std::move(r);
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
  }
  if (g.json) {
    std::printf("[");
    for (int i = 0; i < resp.requests_size(); ++i) {
      const auto& r = resp.requests(i);
      std::printf(
          "%s\n {\"session_id\": %lu, \"request_id\": %lu, \"row\": %u, \"capacity_tokens\": %u, \"host_bytes\": %lu, "
          "\"age_seconds\": %.3f, \"state\": \"%s\", \"shared_bytes\": %lu, \"durable\": %s, "
          "\"lease_seconds_left\": %.3f, \"group\": %s, \"group_holders\": %u}",
          i ? "," : "", r.session_id(), r.request_id(), r.row(), r.capacity_tokens(), r.host_bytes(), r.age_seconds(),
          StateName(r.state()), r.shared_bytes(), r.durable() ? "true" : "false", r.lease_seconds_left(),
          JsonString(r.group()).c_str(), r.group_holders());
    }
    std::printf("%s]\n", resp.requests_size() ? "\n" : "");
    return kExitOk;
  }
  std::printf("%-8s %-20s %-19s %5s %10s %11s %11s %9s  %s\n", "SESSION", "REQUEST", "STATE", "ROW", "TOKENS", "HOST",
              "SHARED", "AGE", "GROUP");
  for (const auto& r : resp.requests()) {
    const bool parked = r.state() == v1::REQUEST_STATE_PARKED || r.state() == v1::REQUEST_STATE_ORPHANED;
    // A group request: "NAME (N ranks)", the ranks whose sessions hold a row over its one set of pages.
    const std::string group =
        r.group().empty() ? "-" : r.group() + " (" + std::to_string(r.group_holders()) + " ranks)";
    std::printf("%-8lu %-20lu %-19s %5s %10u %11s %11s %8.0fs  %s\n", r.session_id(), r.request_id(),
                StateColumn(r).c_str(), parked ? "-" : std::to_string(r.row()).c_str(), r.capacity_tokens(),
                FormatByteSize(r.host_bytes()).c_str(), FormatByteSize(r.shared_bytes()).c_str(), r.age_seconds(),
                group.c_str());
  }
  if (resp.requests_size() == 0) std::printf("(no requests)\n");
  return kExitOk;
}

}  // namespace hisparse::ctl
