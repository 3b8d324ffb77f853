// hisparse-ctl stats: the host pool, sessions and requests of one daemon.
#include <cstdio>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_format.h"
#include "ctl.h"
#include "hisparse/common/size_parse.h"

namespace hisparse::ctl {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void PrintJson(const v1::StatsResponse& s) {
  const auto& p = s.host_pool();
  std::printf("{\"version\": %s, \"uptime_seconds\": %.3f, \"device\": %s,\n", JsonString(s.version()).c_str(),
              s.uptime_seconds(), JsonString(s.device()).c_str());
  std::printf(
      " \"host_pool\": {\"capacity_bytes\": %lu, \"used_bytes\": %lu, \"free_bytes\": %lu, \"fragmentation\": %.6f, "
      "\"segments\": %u, \"segments_in_use\": %u, \"segment_bytes\": %lu, \"hugepages\": %s, \"locked\": %s},\n",
      p.capacity_bytes(), p.used_bytes(), p.free_bytes(), p.fragmentation(), p.segments(), p.segments_in_use(),
      p.segment_bytes(), p.hugepages() ? "true" : "false", p.locked() ? "true" : "false");
  std::printf(" \"sessions\": %u, \"requests\": %u, \"admissions\": %lu, \"rejections\": %lu,\n \"session_stats\": [",
              s.sessions(), s.requests(), s.admissions(), s.rejections());
  for (int i = 0; i < s.session_stats_size(); ++i) {
    const auto& ss = s.session_stats(i);
    const uint64_t selections = ss.hits() + ss.misses();
    std::printf(
        "%s\n  {\"session_id\": %lu, \"engine_name\": %s, \"gpu\": %d, \"requests\": %u, \"host_bytes\": %lu, "
        "\"arena_bytes\": %lu, \"hits\": %lu, \"misses\": %lu, \"hit_rate\": %.6f, \"bytes_fetched\": %lu}",
        i ? "," : "", ss.session_id(), JsonString(ss.engine_name()).c_str(), ss.geometry().gpu(), ss.requests(),
        ss.host_bytes(), ss.arena_bytes(), ss.hits(), ss.misses(),
        selections ? static_cast<double>(ss.hits()) / selections : 0.0, ss.bytes_fetched());
  }
  std::printf("%s]}\n", s.session_stats_size() ? "\n " : "");
}

void PrintTable(const v1::StatsResponse& s) {
  const auto& p = s.host_pool();
  std::printf("hisparsed %s, up %.0f s, device %s\n\n", s.version().c_str(), s.uptime_seconds(), s.device().c_str());
  std::printf("%-10s %12s %12s %12s %8s %14s\n", "POOL", "CAPACITY", "USED", "FREE", "FRAG", "SEGMENTS");
  std::printf("%-10s %12s %12s %12s %7.1f%% %7u/%-6u\n\n", "host", FormatByteSize(p.capacity_bytes()).c_str(),
              FormatByteSize(p.used_bytes()).c_str(), FormatByteSize(p.free_bytes()).c_str(), 100.0 * p.fragmentation(),
              p.segments_in_use(), p.segments());
  std::printf("sessions %u, requests %u, admissions %lu, rejections %lu\n", s.sessions(), s.requests(), s.admissions(),
              s.rejections());
  if (s.session_stats_size() == 0) return;
  std::printf("\n%-8s %-20s %5s %9s %12s %12s %9s\n", "SESSION", "ENGINE", "GPU", "REQUESTS", "HOST", "ARENA", "HIT RATE");
  for (const auto& ss : s.session_stats()) {
    const uint64_t sel = ss.hits() + ss.misses();
    std::printf("%-8lu %-20s %5d %9u %12s %12s %8.1f%%\n", ss.session_id(), ss.engine_name().substr(0, 20).c_str(),
                ss.geometry().gpu(), ss.requests(), FormatByteSize(ss.host_bytes()).c_str(),
                FormatByteSize(ss.arena_bytes()).c_str(), sel ? 100.0 * ss.hits() / sel : 0.0);
  }
}

}  // namespace

int StatsCommand(const GlobalOptions& g) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(g.timeout_ms));
  v1::StatsResponse resp;
  grpc::Status st = stub->Stats(&ctx, v1::StatsRequest(), &resp);
  if (!st.ok()) return ReportRpcError(st, "stats");
  if (g.json) {
    PrintJson(resp);
  } else {
    PrintTable(resp);
  }
  return kExitOk;
}

}  // namespace hisparse::ctl
