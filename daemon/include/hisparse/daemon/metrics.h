// Metrics: THE metric catalog of hisparsed and its Prometheus exposition.
//
// Every metric the daemon exports is named, typed and described once, in metrics.cc's catalog.
// Gauges and counters that the SessionManager already keeps (pool bytes, sessions, requests,
// admissions, rejections, evictions, RESOLVE counters read from the arenas) are read at scrape
// time from one Stats() snapshot, so they can never drift from what `hisparse-ctl stats` shows;
// RPC latency histograms are recorded by the service as calls complete; the health state and
// config reloads by the Daemon as they happen; process_* (descriptors, memory, CPU, start time)
// are read from /proc at scrape time (process_stats.h).
//
// Thread-safe: ObserveRpc is lock-free (atomics); Collect takes the session core's lock once (Stats).
#ifndef HISPARSE_DAEMON_METRICS_H_
#define HISPARSE_DAEMON_METRICS_H_

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hisparse/daemon/metrics_http.h"
#include "hisparse/daemon/session_manager.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"

namespace hisparse {

struct MetricInfo {
  const char* name;
  const char* type;  // "gauge", "counter", "histogram"
  const char* help;
};
// The catalog, in exposition order.
const std::vector<MetricInfo>& MetricCatalog();

class Metrics final : public prometheus::Collectable {
 public:
  // The RPC methods timed, in a fixed order (index = method id).
  enum Method {
    kSession,
    kAdmit,
    kExtend,
    kRelease,
    kStats,
    kListRequests,
    kEvict,
    kDrain,
    kGetConfig,
    kAdmitBatch,
    kReleaseBatch,
    kPark,
    kResume,
    kCommitImport,
    kAbortImport,
    kSetLease,
    kListAdoptable,
    kAdopt,
    kParkBatch,
    kResumeBatch,
    kMethodCount
  };

  // The config loaded at start counts as the first successful load, at construction time.
  // `node`, when not empty, labels hisparse_build_info (the node's name: Kubernetes' NODE_NAME).
  explicit Metrics(const SessionManager* sessions, std::string node = "");
  void ObserveRpc(Method method, double seconds);
  // A config reload (SIGHUP) was applied (ok) or refused, the running config kept (not ok).
  void ObserveReload(bool ok);
  // Restart-only keys whose file value differs from the running one (hisparse_config_restart_pending_keys).
  void SetRestartPendingKeys(size_t keys) { restart_pending_keys_.store(keys, std::memory_order_relaxed); }
  // Control lanes (control_lanes.h): how many are served now, and each hello's outcome.
  void SetControlLanes(size_t lanes) { control_lanes_.store(lanes, std::memory_order_relaxed); }
  void ObserveLaneHello(bool opened) {
    (opened ? lane_hellos_opened_ : lane_hellos_refused_).fetch_add(1, std::memory_order_relaxed);
  }
  // What grpc.health.v1 reports: SERVING (true) or NOT_SERVING.
  void SetServing(bool serving) { serving_.store(serving, std::memory_order_relaxed); }
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  static constexpr std::array<double, 14> kBuckets = {1e-5,   2.5e-5, 5e-5, 1e-4,   2.5e-4, 5e-4, 1e-3,
                                                      2.5e-3, 5e-3,   1e-2, 2.5e-2, 0.1,    1.0,  10.0};
  struct Histogram {
    std::array<std::atomic<uint64_t>, kBuckets.size() + 1> counts{};  // last: +Inf
    std::atomic<uint64_t> sum_ns{0};
  };
  const SessionManager* const sessions_;
  const std::string node_;
  std::array<Histogram, kMethodCount> rpc_;
  std::atomic<bool> serving_{false};
  std::atomic<bool> last_reload_ok_{true};
  std::atomic<double> last_reload_success_seconds_{0};  // Unix time
  std::atomic<uint64_t> reloads_ok_{0};
  std::atomic<uint64_t> reloads_failed_{0};
  std::atomic<size_t> restart_pending_keys_{0};
  std::atomic<size_t> control_lanes_{0};
  std::atomic<uint64_t> lane_hellos_opened_{0};
  std::atomic<uint64_t> lane_hellos_refused_{0};
};

// Serves /metrics on `listen` ("127.0.0.1:9464"). Keeps `metrics` alive while serving.
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              std::shared_ptr<Metrics> metrics);
  ~MetricsServer();
  // The ports it listens on: the one asked for, or the one the kernel chose for port 0.
  std::vector<int> ListeningPorts() const {
    return http_ != nullptr ? std::vector<int>{http_->port()} : exposer_->GetListeningPorts();
  }

 private:
  MetricsServer() = default;
  std::shared_ptr<Metrics> metrics_;
  // One of the two: civetweb's (prometheus-cpp's Exposer), or the daemon's own for an IPv6
  // address where that civetweb has no IPv6 (metrics_http.h).
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<MetricsHttp> http_;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_METRICS_H_
