// hisparse-ctl status: is the daemon healthy, what is it, how full is it.
#include <time.h>

#include <cstdio>
#include <ctime>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_format.h"
#include "ctl.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "hisparse/common/size_parse.h"

namespace hisparse::ctl {
namespace {

// Unix seconds as 2026-12-03T17:45:10Z.
std::string UtcTime(double seconds) {
  const time_t t = static_cast<time_t>(seconds);
  struct tm tm {};
  char buf[32];
  if (::gmtime_r(&t, &tm) == nullptr || std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) return "?";
  return buf;
}

}  // namespace

std::string ReloadJson(const v1::ConfigReloadStatus& r) {
  std::string out =
      absl::StrFormat("{\"time_seconds\": %.3f, \"ok\": %s, \"error\": %s, \"pending_restart\": [", r.time_seconds(),
                      r.ok() || r.time_seconds() == 0 ? "true" : "false", JsonString(r.error()));
  for (int i = 0; i < r.pending_restart_size(); ++i) {
    const v1::PendingRestartKey& k = r.pending_restart(i);
    absl::StrAppendFormat(&out, "%s{\"key\": %s, \"running\": %s, \"file\": %s}", i > 0 ? ", " : "",
                          JsonString(k.key()), JsonString(k.running()), JsonString(k.file()));
  }
  return out + "]}";
}

std::string ReloadLines(const v1::ConfigReloadStatus& r, const std::string& first, const std::string& rest) {
  std::string out;
  if (r.time_seconds() == 0) {
    out = first + "none since start\n";
  } else if (r.ok()) {
    out = absl::StrFormat("%sapplied at %s\n", first, UtcTime(r.time_seconds()));
  } else {
    out =
        absl::StrFormat("%sREFUSED at %s, the running config kept: %s\n", first, UtcTime(r.time_seconds()), r.error());
  }
  if (r.pending_restart_size() > 0) {
    absl::StrAppendFormat(&out, "%spending until a restart (the file's value differs from the running one):\n", rest);
    for (const v1::PendingRestartKey& k : r.pending_restart()) {
      absl::StrAppendFormat(&out, "%s  %s: running \"%s\", file \"%s\"\n", rest, k.key(), k.running(), k.file());
    }
  }
  return out;
}

int StatusCommand(const GlobalOptions& g, const CommandOptions&) {
  auto channel = ConnectChannel(g);
  if (channel == nullptr) return kExitUnreachable;
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest hreq;
  hreq.set_service("hisparse.v1.HiSparse");
  grpc::health::v1::HealthCheckResponse hresp;
  grpc::Status hs = health->Check(Context(g).get(), hreq, &hresp);
  if (!hs.ok()) return ReportRpcError(hs, "health");
  const bool serving = hresp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  v1::StatsResponse s;
  grpc::Status st = v1::HiSparse::NewStub(channel)->Stats(Context(g).get(), v1::StatsRequest(), &s);
  if (!st.ok()) return ReportRpcError(st, "stats");
  const auto& p = s.host_pool();
  uint64_t arena = 0;
  for (const auto& [gpu, bytes] : s.arena_bytes_by_device()) arena += bytes;
  if (g.json) {
    std::printf(
        "{\"health\": %s, \"version\": %s, \"uptime_seconds\": %.3f, \"device\": %s, \"draining\": %s, "
        "\"host_pool\": {\"capacity_bytes\": %lu, \"used_bytes\": %lu, \"free_bytes\": %lu}, \"arena_bytes\": %lu, "
        "\"sessions\": %u, \"requests\": %u, \"reload\": %s}\n",
        serving ? "\"SERVING\"" : "\"NOT_SERVING\"", JsonString(s.version()).c_str(), s.uptime_seconds(),
        JsonString(s.device()).c_str(), s.draining() ? "true" : "false", p.capacity_bytes(), p.used_bytes(),
        p.free_bytes(), arena, s.sessions(), s.requests(), ReloadJson(s.reload()).c_str());
  } else {
    std::printf("health     %s\nversion    %s\nuptime     %.0f s\ndevice     %s\n", serving ? "SERVING" : "NOT_SERVING",
                s.version().c_str(), s.uptime_seconds(), s.device().c_str());
    std::printf("host pool  %s used of %s (%s): %lu pages of %s in %u slabs, %u ready, %u to scrub%s\n",
                FormatByteSize(p.used_bytes()).c_str(), FormatByteSize(p.capacity_bytes()).c_str(),
                Percent(p.capacity_bytes() ? static_cast<double>(p.used_bytes()) / p.capacity_bytes() : 0).c_str(),
                p.pages_used(), FormatByteSize(p.page_bytes()).c_str(), p.slabs(), p.ready_slabs(), p.scrub_queue(),
                p.hugepages() ? ", huge pages" : "");
    std::printf("arenas     %s\nsessions   %u\nrequests   %u\n", FormatByteSize(arena).c_str(), s.sessions(),
                s.requests());
    std::fputs(ReloadLines(s.reload(), "reload     ", "           ").c_str(), stdout);
    if (s.draining()) std::printf("draining: admitting nothing new\n");
  }
  // A daemon that answers but does not serve (draining, starting) is "the daemon said no".
  return serving ? kExitOk : kExitRefused;
}

}  // namespace hisparse::ctl
