// hisparse-ctl requests [--session ID]: every admitted request (live or parked, and the bytes it
// shares with another request, and its TP group with the ranks holding it), or one session's,
// following the daemon's pages to the end.
#include <cstdio>
#include <string>

#include <grpcpp/grpcpp.h>

#include "ctl.h"
#include "hisparse/common/size_parse.h"

namespace hisparse::ctl {
namespace {

// The state column: live (holds an arena row) or parked (host pages only).
const char* StateName(v1::RequestState state) { return state == v1::REQUEST_STATE_PARKED ? "parked" : "live"; }

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
          "\"age_seconds\": %.3f, \"state\": \"%s\", \"shared_bytes\": %lu, \"group\": %s, \"group_holders\": %u}",
          i ? "," : "", r.session_id(), r.request_id(), r.row(), r.capacity_tokens(), r.host_bytes(), r.age_seconds(),
          StateName(r.state()), r.shared_bytes(), JsonString(r.group()).c_str(), r.group_holders());
    }
    std::printf("%s]\n", resp.requests_size() ? "\n" : "");
    return kExitOk;
  }
  std::printf("%-8s %-20s %-6s %5s %10s %11s %11s %9s  %s\n", "SESSION", "REQUEST", "STATE", "ROW", "TOKENS", "HOST",
              "SHARED", "AGE", "GROUP");
  for (const auto& r : resp.requests()) {
    const bool parked = r.state() == v1::REQUEST_STATE_PARKED;
    // A group request: "NAME (N ranks)", the ranks whose sessions hold a row over its one set of pages.
    const std::string group =
        r.group().empty() ? "-" : r.group() + " (" + std::to_string(r.group_holders()) + " ranks)";
    std::printf("%-8lu %-20lu %-6s %5s %10u %11s %11s %8.0fs  %s\n", r.session_id(), r.request_id(),
                StateName(r.state()), parked ? "-" : std::to_string(r.row()).c_str(), r.capacity_tokens(),
                FormatByteSize(r.host_bytes()).c_str(), FormatByteSize(r.shared_bytes()).c_str(), r.age_seconds(),
                group.c_str());
  }
  if (resp.requests_size() == 0) std::printf("(no requests)\n");
  return kExitOk;
}

}  // namespace hisparse::ctl
