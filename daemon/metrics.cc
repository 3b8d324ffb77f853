#include "hisparse/daemon/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "civetweb.h"
#include "hisparse/common/log.h"
#include "hisparse/daemon/process_stats.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace hisparse {
namespace {

// The metrics server's workers and how long one waits for a request before dropping it: N idle
// connections delay a scrape by about N / kMetricsThreads * kMetricsRequestTimeoutMs.
constexpr int kMetricsThreads = 16;
constexpr int kMetricsRequestTimeoutMs = 250;

constexpr const char* kMethodNames[] = {"Session",      "Admit",         "Extend", "Release",      "Stats",
                                        "ListRequests", "Evict",         "Drain",  "GetConfig",    "AdmitBatch",
                                        "ReleaseBatch", "Park",          "Resume", "CommitImport", "AbortImport",
                                        "SetLease",     "ListAdoptable", "Adopt",  "ParkBatch",    "ResumeBatch"};
static_assert(sizeof(kMethodNames) / sizeof(kMethodNames[0]) == Metrics::kMethodCount, "one name per method");

prometheus::MetricType TypeOf(const char* type) {
  const std::string t = type;
  if (t == "counter") return prometheus::MetricType::Counter;
  if (t == "histogram") return prometheus::MetricType::Histogram;
  return prometheus::MetricType::Gauge;
}

// Builds families in catalog order; `add` appends one sample to the family of `name`.
class FamilyBuilder {
 public:
  FamilyBuilder() {
    for (const MetricInfo& m : MetricCatalog()) {
      prometheus::MetricFamily f;
      f.name = m.name;
      f.help = m.help;
      f.type = TypeOf(m.type);
      index_[m.name] = families_.size();
      families_.push_back(std::move(f));
    }
  }
  void Add(const char* name, double value, std::vector<prometheus::ClientMetric::Label> labels = {}) {
    prometheus::MetricFamily& f = families_.at(index_.at(name));
    prometheus::ClientMetric m;
    m.label = std::move(labels);
    if (f.type == prometheus::MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f.metric.push_back(std::move(m));
  }
  prometheus::MetricFamily& family(const char* name) { return families_.at(index_.at(name)); }
  std::vector<prometheus::MetricFamily> Take() { return std::move(families_); }

 private:
  std::vector<prometheus::MetricFamily> families_;
  std::map<std::string, size_t> index_;
};

// Why `listen` ("HOST:PORT", "[V6]:PORT") cannot be bound: the errno of a bind of our own.
std::string WhyCannotListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::StrCat("host \"", host, "\": ", ::gai_strerror(rc));
  }
  std::string why = "it could not be bound";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as civetweb does
    const int rc = ::bind(fd, a->ai_addr, a->ai_addrlen);
    const int err = errno;
    ::close(fd);
    if (rc == 0) continue;
    why = err == EADDRINUSE      ? absl::StrCat("port ", port, " is in use by another process")
          : err == EADDRNOTAVAIL ? absl::StrCat("no interface of this host has the address ", host)
          : err == EACCES        ? absl::StrCat("port ", port, " needs privileges this process lacks")
                                 : std::string(std::strerror(err));
    break;
  }
  ::freeaddrinfo(found);
  return why;
}

}  // namespace

const std::vector<MetricInfo>& MetricCatalog() {
  static const std::vector<MetricInfo> catalog = {
      {"hisparse_build_info", "gauge",
       "Always 1; the label version is the daemon's release (hisparsed --version), node the node's name where "
       "known ($NODE_NAME)."},
      {"hisparse_up", "gauge", "1 while the daemon serves; 0 while draining."},
      {"hisparse_serving", "gauge",
       "1 while grpc.health.v1 reports SERVING; 0 for NOT_SERVING (draining, stopping, or a socket cannot "
       "accept, e.g. out of descriptors)."},
      {"hisparse_config_last_reload_successful", "gauge",
       "1 if the last SIGHUP reload was applied (or none was tried); 0 if it was refused and the running "
       "config kept (the log says why)."},
      {"hisparse_config_last_reload_success_timestamp_seconds", "gauge",
       "Unix time of the last successful config load (start-up counts)."},
      {"hisparse_config_reloads_total", "counter", "SIGHUP config reloads since start, by result (success, failure)."},
      {"hisparse_config_restart_pending_keys", "gauge",
       "Config keys only a restart applies whose value in the file (at the last applied reload) differs from the "
       "running one; hisparse-ctl config lists them. 0: the file and the running config agree."},
      {"hisparse_uptime_seconds", "gauge", "Seconds since the daemon started."},
      {"hisparse_control_lanes", "gauge",
       "Control lanes served now: sessions whose lifecycle calls come on a connection of their own (one daemon "
       "thread each), not over gRPC."},
      {"hisparse_control_lane_hellos_total", "counter",
       "Control lane hellos since start, by result (opened; refused: a wrong token or tenant, an ended session, "
       "limits.control_lanes off, or the daemon stopping)."},
      {"hisparse_host_pool_bytes", "gauge", "Host KV pool bytes by state (used, free)."},
      {"hisparse_host_pool_capacity_bytes", "gauge", "Host KV pool capacity in bytes."},
      {"hisparse_host_pool_fragmentation_ratio", "gauge",
       "Share of free pool bytes that are free pages inside sessions' slabs (usable by that session alone)."},
      {"hisparse_host_pool_pages", "gauge",
       "Host pool pages by state (used: referenced; free: unreferenced in sessions' slabs; reserved: ready slabs)."},
      {"hisparse_host_pool_shared_pages", "gauge", "Host pool pages with more than one reference."},
      {"hisparse_host_pool_slabs", "gauge", "Host pool slabs held, per session."},
      {"hisparse_host_pool_scrub_queue", "gauge", "Slabs their sessions left, waiting to be dropped."},
      {"hisparse_host_pool_slabs_made_inline_total", "counter",
       "Slabs an admission made on its own thread with the daemon's locks held (0 unless prepared slabs were "
       "taken again meanwhile)."},
      {"hisparse_host_pool_retired_bytes", "gauge",
       "Bytes of retired slabs an engine was handed and may still hold, not yet seen freed; charged to their "
       "tenants' host quotas."},
      {"hisparse_host_pool_retired_slabs", "gauge", "Retired slabs charged to their tenants, not yet seen freed."},
      {"hisparse_arena_bytes", "gauge", "Slot-arena bytes held by sessions, per device (gpu=-1: host-emulated)."},
      {"hisparse_sessions", "gauge", "Open sessions."},
      {"hisparse_requests", "gauge", "Admitted requests."},
      {"hisparse_parked_requests", "gauge",
       "Parked requests (host pages kept, no arena row); counted in hisparse_requests too."},
      {"hisparse_importing_requests", "gauge",
       "Requests importing from a remote writer (open grants); counted in hisparse_requests too."},
      {"hisparse_imports_total", "counter", "Import grants ended since start, by how (committed, aborted, expired)."},
      {"hisparse_host_pool_shared_bytes", "gauge", "Host pool bytes serving more than one request (shared prefixes)."},
      {"hisparse_admissions_total", "counter", "Requests admitted since start."},
      {"hisparse_rejections_total", "counter", "Admissions and session opens refused, by reason."},
      {"hisparse_evictions_total", "counter", "Requests evicted (their sessions were notified first)."},
      {"hisparse_undelivered_notices_total", "counter",
       "Eviction notices that did not reach their session (stream gone or not read); memory released anyway."},
      {"hisparse_rpc_duration_seconds", "histogram", "Control-plane RPC latency by method, server side."},
      {"hisparse_resolve_hits_total", "counter", "RESOLVE selections found resident, per session and GPU."},
      {"hisparse_resolve_misses_total", "counter",
       "RESOLVE selections fetched from the host pool, per session and GPU."},
      {"hisparse_resolve_fetched_bytes_total", "counter",
       "Bytes RESOLVE fetched from the host pool, per session and GPU."},
      {"hisparse_resolve_rejected_rows_total", "counter",
       "RESOLVE row-steps refused as invalid input (no record served; the engine got an error), per session and GPU."},
      {"hisparse_durable_requests", "gauge",
       "Requests of open sessions whose lease runs (they survive their session's end)."},
      {"hisparse_orphaned_requests", "gauge",
       "Durable requests of ended sessions, parked until adopted or their lease ends; not in hisparse_requests."},
      {"hisparse_orphaned_bytes", "gauge", "Host pool bytes the orphaned durable requests hold."},
      {"hisparse_lease_expiries_total", "counter", "Orphaned durable requests released because their lease ended."},
      {"hisparse_orphans_refused_total", "counter",
       "Sessions whose durable requests were released at their end: their tenant held "
       "durability.max_orphans_per_tenant orphans."},
      {"hisparse_journal_enabled", "gauge",
       "1 while durable requests are journaled into a service manager's fd store (they survive a daemon restart)."},
      {"hisparse_journal_requests", "gauge", "Durable requests the restart journal holds."},
      {"hisparse_journal_bytes", "gauge", "Bytes of the restart journal's current generation."},
      {"hisparse_journal_stored_slabs", "gauge", "Host pool slabs held in the service manager's fd store."},
      {"hisparse_journal_unstored_slabs_total", "counter",
       "Slabs of durable requests the fd store had no room for (at most 8192 are kept): their requests will not "
       "survive a daemon restart."},
      {"hisparse_journal_failures_total", "counter",
       "Journal commits or slab hand-overs the fd store or the journal's memfd refused (logged)."},
      {"hisparse_restart_recovered_requests", "gauge",
       "Durable requests this daemon took back from the one before it, at start."},
      {"hisparse_restart_dropped_requests", "gauge",
       "Durable requests this daemon found at start but could not take back (the log says why)."},
      {"hisparse_tp_groups", "gauge", "TP groups (OpenSession.group) on the node."},
      {"hisparse_host_pool_group_bytes", "gauge",
       "Host pool bytes of TP groups' requests, counted once however many ranks read them."},
      {"hisparse_tp_group_requests", "gauge", "TP-group requests (each counted once)."},
      {"hisparse_tp_group_shares", "gauge",
       "Rows the ranks of TP groups hold over their groups' requests (requests x ranks when all hold all)."},
      // The standard process metrics of Prometheus' client libraries, read from /proc at scrape time.
      {"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."},
      {"process_open_fds", "gauge", "Number of open file descriptors."},
      {"process_max_fds", "gauge", "Maximum number of open file descriptors (RLIMIT_NOFILE, soft)."},
      {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes."},
      {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes."},
      {"process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds."},
  };
  return catalog;
}

Metrics::Metrics(const SessionManager* sessions, std::string node) : sessions_(sessions), node_(std::move(node)) {
  last_reload_success_seconds_.store(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
}

void Metrics::ObserveReload(bool ok) {
  last_reload_ok_.store(ok);
  if (ok) {
    last_reload_success_seconds_.store(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    reloads_ok_.fetch_add(1, std::memory_order_relaxed);
  } else {
    reloads_failed_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Metrics::ObserveRpc(Method method, double seconds) {
  Histogram& h = rpc_[method];
  size_t b = 0;
  while (b < kBuckets.size() && seconds > kBuckets[b]) ++b;
  h.counts[b].fetch_add(1, std::memory_order_relaxed);
  h.sum_ns.fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

std::vector<prometheus::MetricFamily> Metrics::Collect() const {
  const v1::StatsResponse st = sessions_->Stats();
  FamilyBuilder fb;
  if (node_.empty()) {
    fb.Add("hisparse_build_info", 1, {{"version", st.version()}});
  } else {
    fb.Add("hisparse_build_info", 1, {{"node", node_}, {"version", st.version()}});
  }
  fb.Add("hisparse_up", st.draining() ? 0 : 1);
  fb.Add("hisparse_serving", serving_.load(std::memory_order_relaxed) ? 1 : 0);
  fb.Add("hisparse_config_last_reload_successful", last_reload_ok_.load() ? 1 : 0);
  fb.Add("hisparse_config_last_reload_success_timestamp_seconds", last_reload_success_seconds_.load());
  fb.Add("hisparse_config_reloads_total", static_cast<double>(reloads_ok_.load()), {{"result", "success"}});
  fb.Add("hisparse_config_reloads_total", static_cast<double>(reloads_failed_.load()), {{"result", "failure"}});
  fb.Add("hisparse_config_restart_pending_keys", static_cast<double>(restart_pending_keys_.load()));
  fb.Add("hisparse_uptime_seconds", st.uptime_seconds());
  fb.Add("hisparse_control_lanes", static_cast<double>(control_lanes_.load(std::memory_order_relaxed)));
  fb.Add("hisparse_control_lane_hellos_total", static_cast<double>(lane_hellos_opened_.load()), {{"result", "opened"}});
  fb.Add("hisparse_control_lane_hellos_total", static_cast<double>(lane_hellos_refused_.load()),
         {{"result", "refused"}});
  const auto& p = st.host_pool();
  fb.Add("hisparse_host_pool_bytes", static_cast<double>(p.used_bytes()), {{"state", "used"}});
  fb.Add("hisparse_host_pool_bytes", static_cast<double>(p.free_bytes()), {{"state", "free"}});
  fb.Add("hisparse_host_pool_capacity_bytes", static_cast<double>(p.capacity_bytes()));
  fb.Add("hisparse_host_pool_fragmentation_ratio", p.fragmentation());
  fb.Add("hisparse_host_pool_pages", static_cast<double>(p.pages_used()), {{"state", "used"}});
  fb.Add("hisparse_host_pool_pages", static_cast<double>(p.pages_free()), {{"state", "free"}});
  fb.Add("hisparse_host_pool_pages", static_cast<double>(p.pages_reserved()), {{"state", "reserved"}});
  fb.Add("hisparse_host_pool_shared_pages", static_cast<double>(p.pages_shared()));
  for (const auto& [session, slabs] : p.slabs_by_session()) {
    fb.Add("hisparse_host_pool_slabs", slabs, {{"session", absl::StrCat(session)}});
  }
  fb.Add("hisparse_host_pool_scrub_queue", p.scrub_queue());
  fb.Add("hisparse_host_pool_slabs_made_inline_total", static_cast<double>(p.slabs_made_inline()));
  fb.Add("hisparse_host_pool_retired_bytes", static_cast<double>(p.retired_bytes()));
  fb.Add("hisparse_host_pool_retired_slabs", p.retired_slabs());
  for (const auto& [gpu, bytes] : st.arena_bytes_by_device()) {
    fb.Add("hisparse_arena_bytes", static_cast<double>(bytes), {{"gpu", absl::StrCat(gpu)}});
  }
  fb.Add("hisparse_sessions", st.sessions());
  fb.Add("hisparse_requests", st.requests());
  fb.Add("hisparse_parked_requests", st.parked_requests());
  fb.Add("hisparse_importing_requests", st.importing_requests());
  fb.Add("hisparse_imports_total", static_cast<double>(st.imports_committed()), {{"end", "committed"}});
  fb.Add("hisparse_imports_total", static_cast<double>(st.imports_aborted()), {{"end", "aborted"}});
  fb.Add("hisparse_imports_total", static_cast<double>(st.imports_expired()), {{"end", "expired"}});
  fb.Add("hisparse_durable_requests", st.durable_requests());
  fb.Add("hisparse_orphaned_requests", st.orphaned_requests());
  fb.Add("hisparse_orphaned_bytes", static_cast<double>(st.orphaned_bytes()));
  fb.Add("hisparse_lease_expiries_total", static_cast<double>(st.lease_expiries()));
  fb.Add("hisparse_orphans_refused_total", static_cast<double>(st.orphans_refused()));
  const v1::RestartStats& rs = st.restart();
  fb.Add("hisparse_journal_enabled", rs.journal() ? 1 : 0);
  fb.Add("hisparse_journal_requests", static_cast<double>(rs.journal_requests()));
  fb.Add("hisparse_journal_bytes", static_cast<double>(rs.journal_bytes()));
  fb.Add("hisparse_journal_stored_slabs", static_cast<double>(rs.stored_slabs()));
  fb.Add("hisparse_journal_unstored_slabs_total", static_cast<double>(rs.unstored_slabs()));
  fb.Add("hisparse_journal_failures_total", static_cast<double>(rs.journal_failures()));
  fb.Add("hisparse_restart_recovered_requests", static_cast<double>(rs.recovered_requests()));
  fb.Add("hisparse_restart_dropped_requests", static_cast<double>(rs.dropped_requests()));
  fb.Add("hisparse_host_pool_shared_bytes", static_cast<double>(p.shared_bytes()));
  fb.Add("hisparse_admissions_total", static_cast<double>(st.admissions()));
  for (const RejectReason r : kRejectReasons) {
    const char* reason = RejectReasonName(r);
    uint64_t count = 0;
    for (const auto& rc : st.rejections_by_reason()) {
      if (rc.reason() == reason) count = rc.count();
    }
    fb.Add("hisparse_rejections_total", static_cast<double>(count), {{"reason", reason}});
  }
  fb.Add("hisparse_evictions_total", static_cast<double>(st.evictions()));
  fb.Add("hisparse_undelivered_notices_total", static_cast<double>(st.undelivered_notices()));
  prometheus::MetricFamily& rpc = fb.family("hisparse_rpc_duration_seconds");
  for (int m = 0; m < kMethodCount; ++m) {
    prometheus::ClientMetric cm;
    cm.label = {{"method", kMethodNames[m]}};
    uint64_t cumulative = 0;
    for (size_t b = 0; b <= kBuckets.size(); ++b) {
      cumulative += rpc_[m].counts[b].load(std::memory_order_relaxed);
      cm.histogram.bucket.push_back(
          {cumulative, b < kBuckets.size() ? kBuckets[b] : std::numeric_limits<double>::infinity()});
    }
    cm.histogram.sample_count = cumulative;
    cm.histogram.sample_sum = rpc_[m].sum_ns.load(std::memory_order_relaxed) * 1e-9;
    rpc.metric.push_back(std::move(cm));
  }
  for (const auto& ss : st.session_stats()) {
    std::vector<prometheus::ClientMetric::Label> labels = {{"gpu", absl::StrCat(ss.geometry().gpu())},
                                                           {"session", absl::StrCat(ss.session_id())}};
    fb.Add("hisparse_resolve_hits_total", static_cast<double>(ss.hits()), labels);
    fb.Add("hisparse_resolve_misses_total", static_cast<double>(ss.misses()), labels);
    fb.Add("hisparse_resolve_fetched_bytes_total", static_cast<double>(ss.bytes_fetched()), labels);
    fb.Add("hisparse_resolve_rejected_rows_total", static_cast<double>(ss.rejected()), labels);
  }
  uint64_t group_requests = 0, group_shares = 0;
  for (const auto& g : st.groups()) {
    group_requests += g.requests();
    group_shares += g.shares();
  }
  fb.Add("hisparse_tp_groups", st.groups_size());
  fb.Add("hisparse_host_pool_group_bytes", static_cast<double>(p.group_bytes()));
  fb.Add("hisparse_tp_group_requests", static_cast<double>(group_requests));
  fb.Add("hisparse_tp_group_shares", static_cast<double>(group_shares));
  // /proc is always there on Linux; were it not, the families go without samples (and say why
  // in the log) rather than reporting zeros that look real.
  if (const absl::StatusOr<ProcessStats> ps = ReadProcessStats(); ps.ok()) {
    fb.Add("process_cpu_seconds_total", ps->cpu_seconds);
    fb.Add("process_open_fds", static_cast<double>(ps->open_fds));
    fb.Add("process_max_fds", static_cast<double>(ps->max_fds));
    fb.Add("process_resident_memory_bytes", static_cast<double>(ps->resident_bytes));
    fb.Add("process_virtual_memory_bytes", static_cast<double>(ps->virtual_bytes));
    fb.Add("process_start_time_seconds", ps->start_time_seconds);
  } else {
    LOG(WARNING) << "metrics: process_* not exported: " << ps.status();
  }
  return fb.Take();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    std::shared_ptr<Metrics> metrics) {
  // civetweb takes IPv6 as "[addr]:port", but only when built with it (feature bit 8), which
  // Debian 12's libcivetweb1 is not: then the daemon serves such an address itself.
  constexpr unsigned kCivetwebIpv6 = 8;
  if (!listen.empty() && listen.front() == '[' && mg_check_feature(kCivetwebIpv6) == 0) {
    std::unique_ptr<MetricsServer> server(new MetricsServer());
    server->metrics_ = std::move(metrics);
    absl::StatusOr<std::unique_ptr<MetricsHttp>> http = MetricsHttp::Start(
        listen, [m = server->metrics_] { return prometheus::TextSerializer().Serialize(m->Collect()); });
    if (!http.ok()) {
      return absl::Status(http.status().code(),
                          absl::StrCat("cannot serve metrics on ", listen, ": ", http.status().message(),
                                       ": set metrics.listen (--metrics-listen) to another [ADDR]:PORT or HOST:PORT, "
                                       "or to empty to turn metrics off"));
    }
    server->http_ = *std::move(http);
    return server;
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->metrics_ = std::move(metrics);
  try {
    // civetweb's "listening_ports" syntax: "127.0.0.1:9464". civetweb (1.15 in Debian) gives each
    // connection a worker thread until it is done, and a connection that sends nothing holds its
    // worker for request_timeout_ms: idle connections must not be able to starve the scrape, so
    // the workers are several, idle ones are dropped quickly and keep-alive is off.
    server->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", absl::StrCat(kMetricsThreads), "request_timeout_ms",
        absl::StrCat(kMetricsRequestTimeoutMs), "enable_keep_alive", "no"});
  } catch (const std::exception& e) {
    // civetweb says only that it could not bind; binding the address here says why.
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", WhyCannotListen(listen),
                                               ": set metrics.listen (--metrics-listen) to another HOST:PORT, or "
                                               "to empty to turn metrics off"));
  }
  server->exposer_->RegisterCollectable(server->metrics_);
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace hisparse
