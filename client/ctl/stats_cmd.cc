// hisparse-ctl stats: the host pool, sessions and requests of one daemon.
#include <cstdio>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_format.h"
#include "ctl.h"
#include "hisparse/common/size_parse.h"

namespace hisparse::ctl {
namespace {

void PrintJson(const v1::StatsResponse& s) {
  const auto& p = s.host_pool();
  std::printf("{\"version\": %s, \"uptime_seconds\": %.3f, \"device\": %s,\n", JsonString(s.version()).c_str(),
              s.uptime_seconds(), JsonString(s.device()).c_str());
  std::printf(
      " \"host_pool\": {\"capacity_bytes\": %lu, \"used_bytes\": %lu, \"free_bytes\": %lu, \"fragmentation\": %.6f, "
      "\"page_bytes\": %lu, \"slab_bytes\": %lu, \"pages_used\": %lu, \"pages_free\": %lu, \"pages_reserved\": %lu, "
      "\"pages_shared\": %lu, \"shared_bytes\": %lu, \"slabs\": %u, \"ready_slabs\": %u, \"scrub_queue\": %u, "
      "\"hugepages\": %s, "
      "\"locked\": %s, \"group_bytes\": %lu},\n",
      p.capacity_bytes(), p.used_bytes(), p.free_bytes(), p.fragmentation(), p.page_bytes(), p.slab_bytes(),
      p.pages_used(), p.pages_free(), p.pages_reserved(), p.pages_shared(), p.shared_bytes(), p.slabs(),
      p.ready_slabs(), p.scrub_queue(), p.hugepages() ? "true" : "false", p.locked() ? "true" : "false",
      p.group_bytes());
  std::printf(" \"arena_bytes_by_gpu\": {");
  bool first = true;
  for (const auto& [gpu, bytes] : s.arena_bytes_by_device()) {
    std::printf("%s\"%d\": %lu", first ? "" : ", ", gpu, bytes);
    first = false;
  }
  std::printf("}, \"arena_budget_bytes\": %lu, \"draining\": %s,\n", s.arena_budget_bytes(),
              s.draining() ? "true" : "false");
  std::printf(
      " \"sessions\": %u, \"requests\": %u, \"parked_requests\": %u, \"admissions\": %lu, \"rejections\": %lu, "
      "\"evictions\": %lu,\n \"durable_requests\": %u, \"orphaned_requests\": %u, \"orphaned_bytes\": %lu, "
      "\"lease_expiries\": %lu,\n \"importing_requests\": %u, \"imports_committed\": %lu, \"imports_aborted\": %lu, "
      "\"imports_expired\": %lu,\n",
      s.sessions(), s.requests(), s.parked_requests(), s.admissions(), s.rejections(), s.evictions(),
      s.durable_requests(), s.orphaned_requests(), s.orphaned_bytes(), s.lease_expiries(), s.importing_requests(),
      s.imports_committed(), s.imports_aborted(), s.imports_expired());
  const v1::RestartStats& r = s.restart();
  std::printf(
      " \"restart\": {\"journal\": %s, \"journal_generation\": %lu, \"journal_bytes\": %lu, \"journal_requests\": %lu, "
      "\"stored_slabs\": %lu, \"unstored_slabs\": %lu, \"journal_failures\": %lu, \"recovered_requests\": %lu, "
      "\"dropped_requests\": %lu, \"journal_refused\": %s, \"recovery_seconds\": %.6f},\n \"session_stats\": [",
      r.journal() ? "true" : "false", r.journal_generation(), r.journal_bytes(), r.journal_requests(), r.stored_slabs(),
      r.unstored_slabs(), r.journal_failures(), r.recovered_requests(), r.dropped_requests(),
      r.journal_refused() ? "true" : "false", r.recovery_seconds());
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
  std::printf("%-10s %12s %12s %12s %8s %10s %10s %10s %7s %6s\n", "POOL", "CAPACITY", "USED", "FREE", "FRAG", "PAGES",
              "FREE-PG", "RESERVED", "SLABS", "SCRUB");
  std::printf("%-10s %12s %12s %12s %7.1f%% %10lu %10lu %10lu %7u %6u\n", "host",
              FormatByteSize(p.capacity_bytes()).c_str(), FormatByteSize(p.used_bytes()).c_str(),
              FormatByteSize(p.free_bytes()).c_str(), 100.0 * p.fragmentation(), p.pages_used(), p.pages_free(),
              p.pages_reserved(), p.slabs(), p.scrub_queue());
  std::printf("%-10s pages of %s, slabs up to %s, shared %s\n\n", "", FormatByteSize(p.page_bytes()).c_str(),
              FormatByteSize(p.slab_bytes()).c_str(), FormatByteSize(p.shared_bytes()).c_str());
  for (const auto& [gpu, bytes] : s.arena_bytes_by_device()) {
    std::printf("%-10s %12s %12s\n", gpu < 0 ? "arena host" : absl::StrFormat("arena gpu%d", gpu).c_str(),
                s.arena_budget_bytes() ? FormatByteSize(s.arena_budget_bytes()).c_str() : "unlimited",
                FormatByteSize(bytes).c_str());
  }
  std::printf("\nsessions %u, requests %u (parked %u), admissions %lu, rejections %lu, evictions %lu%s\n", s.sessions(),
              s.requests(), s.parked_requests(), s.admissions(), s.rejections(), s.evictions(),
              s.draining() ? " (draining)" : "");
  if (s.durable_requests() != 0 || s.orphaned_requests() != 0 || s.lease_expiries() != 0) {
    std::printf("durable %u, orphaned %u (%s, waiting for adoption), lease expiries %lu\n", s.durable_requests(),
                s.orphaned_requests(), FormatByteSize(s.orphaned_bytes()).c_str(), s.lease_expiries());
  }
  const v1::RestartStats& r = s.restart();
  if (r.journal()) {
    std::printf(
        "restart journal: %lu durable requests, %lu slabs in the fd store%s; at start recovered %lu, dropped %lu%s\n",
        r.journal_requests(), r.stored_slabs(),
        r.unstored_slabs() + r.journal_failures() != 0
            ? absl::StrFormat(" (NOT KEPT: %lu slabs without room, %lu failures)", r.unstored_slabs(),
                              r.journal_failures())
                  .c_str()
            : "",
        r.recovered_requests(), r.dropped_requests(), r.journal_refused() ? " (the former journal was REFUSED)" : "");
  } else {
    std::printf(
        "restart journal: off (durable requests end with the daemon: no fd store, or keep_across_restarts off)\n");
  }
  if (s.importing_requests() != 0 || s.imports_committed() + s.imports_aborted() + s.imports_expired() != 0) {
    std::printf("importing %u; imports committed %lu, aborted %lu, expired %lu\n", s.importing_requests(),
                s.imports_committed(), s.imports_aborted(), s.imports_expired());
  }
  if (s.groups_size() != 0) {
    std::printf("TP groups %d, their host bytes %s (counted once, whatever the ranks)\n", s.groups_size(),
                FormatByteSize(p.group_bytes()).c_str());
  }
  if (s.session_stats_size() == 0) return;
  std::printf("\n%-8s %-20s %4s %9s %11s %11s %12s %12s %9s %11s\n", "SESSION", "ENGINE", "GPU", "REQUESTS", "HOST",
              "ARENA", "HITS", "MISSES", "HIT RATE", "FETCHED");
  for (const auto& ss : s.session_stats()) {
    const uint64_t sel = ss.hits() + ss.misses();
    std::printf("%-8lu %-20s %4d %9u %11s %11s %12lu %12lu %9s %11s\n", ss.session_id(),
                ss.engine_name().substr(0, 20).c_str(), ss.geometry().gpu(), ss.requests(),
                FormatByteSize(ss.host_bytes()).c_str(), FormatByteSize(ss.arena_bytes()).c_str(), ss.hits(),
                ss.misses(), sel ? Percent(static_cast<double>(ss.hits()) / sel).c_str() : "-",
                FormatByteSize(ss.bytes_fetched()).c_str());
  }
}

}  // namespace

void PrintStats(const v1::StatsResponse& s, bool json) {
  if (json) {
    PrintJson(s);
  } else {
    PrintTable(s);
  }
}

int StatsCommand(const GlobalOptions& g, const CommandOptions&) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  v1::StatsResponse resp;
  grpc::Status st = stub->Stats(Context(g).get(), v1::StatsRequest(), &resp);
  if (!st.ok()) return ReportRpcError(st, "stats");
  PrintStats(resp, g.json);
  return kExitOk;
}

}  // namespace hisparse::ctl
