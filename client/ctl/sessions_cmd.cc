// hisparse-ctl sessions: the engines attached, with their geometry and memory.
#include <cstdio>

#include <grpcpp/grpcpp.h>

#include "ctl.h"
#include "hisparse/common/size_parse.h"

namespace hisparse::ctl {

int SessionsCommand(const GlobalOptions& g, const CommandOptions&) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  v1::StatsResponse s;
  grpc::Status st = stub->Stats(Context(g).get(), v1::StatsRequest(), &s);
  if (!st.ok()) return ReportRpcError(st, "stats");
  if (g.json) {
    std::printf("[");
    for (int i = 0; i < s.session_stats_size(); ++i) {
      const auto& ss = s.session_stats(i);
      const auto& geo = ss.geometry();
      std::printf(
          "%s\n {\"session_id\": %lu, \"engine_name\": %s, \"gpu\": %d, \"num_layers\": %u, \"record_bytes\": %u, "
          "\"k\": %u, \"slots\": %u, \"max_requests\": %u, \"requests\": %u, \"host_bytes\": %lu, \"arena_bytes\": "
          "%lu, \"arena_kind\": %s}",
          i ? "," : "", ss.session_id(), JsonString(ss.engine_name()).c_str(), geo.gpu(), geo.num_layers(),
          geo.record_bytes(), geo.k(), geo.slots(), geo.max_requests(), ss.requests(), ss.host_bytes(),
          ss.arena_bytes(), JsonString(ss.arena_kind()).c_str());
    }
    std::printf("%s]\n", s.session_stats_size() ? "\n" : "");
    return kExitOk;
  }
  std::printf("%-8s %-20s %4s %7s %7s %6s %6s %9s %11s %11s %-8s\n", "SESSION", "ENGINE", "GPU", "LAYERS", "RECORD",
              "K", "B", "REQUESTS", "HOST", "ARENA", "SHARED");
  for (const auto& ss : s.session_stats()) {
    const auto& geo = ss.geometry();
    std::printf("%-8lu %-20s %4d %7u %6uB %6u %6u %4u/%-4u %11s %11s %-8s\n", ss.session_id(),
                ss.engine_name().substr(0, 20).c_str(), geo.gpu(), geo.num_layers(), geo.record_bytes(), geo.k(),
                geo.slots(), ss.requests(), geo.max_requests(), FormatByteSize(ss.host_bytes()).c_str(),
                FormatByteSize(ss.arena_bytes()).c_str(), ss.arena_kind().c_str());
  }
  if (s.session_stats_size() == 0) std::printf("(no sessions)\n");
  return kExitOk;
}

}  // namespace hisparse::ctl
