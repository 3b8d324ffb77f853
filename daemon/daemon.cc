#include "hisparse/daemon/daemon.h"

#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_posix.h>
#include <sys/stat.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "hisparse/common/fd_store.h"
#include "hisparse/common/log.h"
#include "hisparse/common/path_lock.h"
#include "hisparse/common/size_parse.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/common/version.h"
#include "hisparse/daemon/access.h"
#include "hisparse/daemon/control_lanes.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/device_choice.h"
#include "hisparse/daemon/fd_server.h"
#include "hisparse/daemon/memory_headroom.h"
#include "hisparse/daemon/metrics.h"
#include "hisparse/daemon/page_pool.h"
#include "hisparse/daemon/request_journal.h"
#include "hisparse/daemon/service.h"
#include "hisparse/daemon/session_manager.h"
#include "hisparse/daemon/stream_gate.h"

namespace hisparse {

inline constexpr char kVersion[] = HISPARSE_VERSION;

SessionManager::QuotaOptions QuotasFrom(const DaemonConfig& c) {
  return SessionManager::QuotaOptions{c.quotas.host_bytes, c.quotas.arena_bytes,
                                      static_cast<uint32_t>(c.quotas.requests),
                                      static_cast<uint32_t>(c.quotas.sessions), static_cast<uint64_t>(c.quotas.pages)};
}
// Engines and the daemon share these sockets; the group decides who may attach (issue: access).
inline constexpr mode_t kSocketMode = 0660;

namespace {

// gRPC's sync server runs every call on a thread of its own, and a Session stream holds its thread
// for the session's life. The daemon bounds them (grpc::ResourceQuota) so that overload is answered
// with RESOURCE_EXHAUSTED rather than ending in a failed thread creation: one thread per session
// stream, one per session for a unary call in flight beside it, and a few for calls that need no
// session (health, stats, admin) and for gRPC's pollers. A call that finds the quota spent is
// refused before any handler sees it, whoever calls and whatever the method, so the share of
// health and admin calls is kept by the gate instead (stream_gate.h): Session streams, the one
// kind of call that holds its thread, take at most max_sessions of these threads from their start
// (before `open`), and the other max_sessions + 16 stay free for calls that return.
constexpr int kSessionlessCallThreads = 16;
int GrpcThreadLimit(int max_sessions) { return 2 * max_sessions + kSessionlessCallThreads; }

SessionStreamGate::Limits GateLimitsFrom(const LimitsConfig& l) {
  return SessionStreamGate::Limits{l.max_sessions, l.max_opening_sessions_per_peer,
                                   absl::Milliseconds(l.session_open_timeout_ms)};
}

FdServer::InFlightLimits FdInFlightFrom(const LimitsConfig& l) {
  return FdServer::InFlightLimits{l.max_fds_in_flight_per_connection, l.max_fds_in_flight_per_peer};
}

// Refuses a pool the machine cannot hold (pre-touching it would end in the OOM killer), before a
// page of it is touched. Huge pages the pool may take count apart: they are reserved already.
// What the daemon holds already (its VmRSS) counts with the pool.
// Returns the memory left after the pool: limits.host_arena_bytes' auto value. Unlimited (with a
// warning) when /proc/meminfo cannot be read.
// `held_bytes` of the pool are slabs a former daemon left in the fd store (request_journal.h):
// their memory is in use already, so only the rest of the pool must fit what is available.
absl::StatusOr<uint64_t> CheckMemoryAtStart(uint64_t pool_bytes, bool may_use_hugetlb, uint64_t held_bytes) {
  const absl::StatusOr<MemoryHeadroom> headroom = ReadMemoryHeadroom();
  if (!headroom.ok()) {
    LOG(WARNING) << "cannot tell how much memory is available (" << headroom.status()
                 << "): the host pool is not checked against it and host slot arenas have no auto budget";
    return UINT64_MAX;
  }
  // The cgroup's limit covers what the daemon holds already too.
  const uint64_t fresh = pool_bytes - std::min(pool_bytes, held_bytes);
  const uint64_t need = OrdinaryPoolBytes(*headroom, fresh, may_use_hugetlb) + headroom->self_rss;
  HS_RETURN_IF_ERROR(CheckMemoryFits(
      *headroom, need,
      absl::StrCat("the host pool (host_pool.size, ", pool_bytes, " bytes",
                   held_bytes != 0
                       ? absl::StrCat(", of which ", held_bytes, " are the former daemon's slabs, held already")
                       : "",
                   ") with the daemon's own ", headroom->self_rss, " resident bytes")));
  const uint64_t left = headroom->bytes() - need;
  LOG(INFO) << "memory: " << headroom->Describe() << "; after the pool " << FormatByteSize(left)
            << " are left (the auto value of limits.host_arena_bytes)";
  return left;
}

// hisparse-import-worker, beside the running hisparsed (the build's bin/ and an installed bindir
// alike).
std::string ImportWorkerBinary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (ec ? std::filesystem::path("/usr/bin") : self.parent_path()) / "hisparse-import-worker";
}

}  // namespace

// Ends the leases of orphaned durable requests (SessionManager::ExpireLeases) once a second, on a
// thread of its own, until destroyed. A lease therefore ends at most a second late. The same tick
// sweeps retired slabs that an engine touched again after their punch (SweepRetiredSlabs).
class LeaseSweeper {
 public:
  explicit LeaseSweeper(SessionManager* sessions)
      : thread_([this, sessions] {
          while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
            sessions->ExpireLeases();
            sessions->SweepRetiredSlabs();  // retired slabs an engine touched again (page_pool.h)
          }
        }) {}
  ~LeaseSweeper() {
    stop_.Notify();
    thread_.join();
  }
  LeaseSweeper(const LeaseSweeper&) = delete;
  LeaseSweeper& operator=(const LeaseSweeper&) = delete;

 private:
  absl::Notification stop_;  // before thread_: it exists before the thread reads it
  std::thread thread_;
};

// Restarts without loss (request_journal.h): the fds a service manager's store passed at start,
// read into a plan, and the store that keeps the new life's. Without a store (or with
// durability.keep_across_restarts off) there is nothing to take back and no journal.
struct StartRecovery {
  std::unique_ptr<FdStore> store;
  RecoveryPlan plan;
  // Ids of this life start at epoch << 40 (0: a first life, ids from 1).
  uint64_t FirstId() const { return plan.next_epoch() == 0 ? 1 : (plan.next_epoch() << 40) | 1; }
  // The bytes of the slabs the pool will take back.
  uint64_t HeldBytes(uint64_t page_bytes) const {
    uint64_t bytes = 0;
    for (const PagePool::RecoveredSlab& slab : plan.slabs) bytes += slab.refs.size() * page_bytes;
    return bytes;
  }
  absl::Time started = absl::Now();
};

StartRecovery TakeStoredFds(const DaemonConfig& config) {
  StartRecovery out;
  absl::StatusOr<std::vector<ListenFd>> fds = TakeListenFds();
  if (!fds.ok()) {
    LOG(ERROR) << "the fds passed at start cannot be taken (" << fds.status() << "): none is recovered";
    fds = std::vector<ListenFd>();
  }
  const bool wanted = config.durability.keep_across_restarts && config.durability.max_lease_seconds > 0;
  absl::StatusOr<std::unique_ptr<FdStore>> store = FdStore::FromEnvironment();
  if (wanted && store.ok()) {
    out.store = *std::move(store);
  } else if (wanted && !absl::IsNotFound(store.status())) {
    LOG(ERROR) << "the service manager's fd store cannot be reached (" << store.status()
               << "): durable requests will not outlive this process";
  } else if (wanted) {
    LOG(INFO) << "no service manager keeps fds for hisparsed ($NOTIFY_SOCKET unset): durable requests outlive "
                 "their engines, not this process";
  }
  if (out.store == nullptr) {
    if (!fds->empty()) LOG(WARNING) << fds->size() << " fds passed at start are dropped: no journal is kept";
    return out;
  }
  out.plan = PlanRecovery(*std::move(fds), config.host_pool.page_size, config.host_pool.size, absl::Now());
  // The slabs nothing restored needs are freed before the pool's memory is checked.
  for (const auto& [name, fd] : out.plan.unused) {
    if (absl::StatusOr<uint64_t> left = PagePool::PunchOut(fd.get()); !left.ok()) {
      LOG(WARNING) << "restart: scrubbing " << name << ": " << left.status();
    }
  }
  return out;
}

// After the pool took the plan's slabs back: scrubs the slabs nothing needs, starts this life's
// journal holding the restored requests, and logs what the restart kept and lost.
absl::StatusOr<std::unique_ptr<RequestJournal>> StartJournal(StartRecovery& r, uint64_t page_bytes) {
  RecoveryPlan& plan = r.plan;
  if (!plan.refused.empty()) {
    LOG(ERROR) << "restart: the request journal is refused, " << plan.refused
               << "; every slab it names is scrubbed and no durable request is recovered";
  }
  for (const std::string& line : plan.dropped) LOG(WARNING) << "restart: not recovered: " << line;
  std::vector<std::string> stale = std::move(plan.stale_names);
  for (const auto& [name, fd] : plan.unused) stale.push_back(name);  // punched in TakeStoredFds
  journal::Header header;
  header.set_format(RequestJournal::kFormat);
  header.set_generation(plan.found ? plan.header.generation() + 1 : 1);
  header.set_epoch(plan.next_epoch());
  header.set_page_bytes(page_bytes);
  header.set_daemon_version(kVersion);
  // The restored requests' slabs are in the store already (the pool has taken plan.slabs).
  std::set<uint64_t> stored;
  for (const journal::Put& put : plan.puts) {
    for (const journal::Layer& layer : put.layers()) stored.insert(layer.slab().begin(), layer.slab().end());
  }
  return RequestJournal::Start(std::move(r.store), header, plan.puts, stored, stale);
}

struct Daemon::Impl {
  PathLock socket_lock;  // first member: released last, after the sockets are gone
  // Outlives `sessions` (whose pool's worker reports dropped slabs to it).
  std::unique_ptr<RequestJournal> journal;
  mutable absl::Mutex config_mu;
  DaemonConfig config ABSL_GUARDED_BY(config_mu);
  v1::ConfigReloadStatus reload ABSL_GUARDED_BY(config_mu);  // the last reload (Stats, GetConfig)
  std::string grpc_address;
  std::string fd_socket_path;
  std::unique_ptr<SessionManager> sessions;
  std::unique_ptr<ImportTarget> import_target;  // null: imports off; goes before `sessions`
  std::unique_ptr<LeaseSweeper> lease_sweeper;  // goes before `sessions` too
  std::shared_ptr<Metrics> metrics;             // made before anything that reports health
  std::unique_ptr<MetricsServer> metrics_server;
  PeerRegistry peers;                              // who is at the other end of each control connection
  std::unique_ptr<SessionStreamGate> stream_gate;  // Session streams before `open`; outlives `server`
  std::unique_ptr<HiSparseService> service;
  std::thread drainer;  // runs Shutdown when a drain with exit_when_idle goes idle
  grpc::ResourceQuota grpc_threads{"hisparsed-grpc-threads"};
  uint64_t auto_host_arena_bytes = UINT64_MAX;  // limits.host_arena_bytes: 0 (auto) means this
  std::unique_ptr<grpc::Server> server;
  // Control lanes (control_lanes.h): after the manager and metrics they serve, before the fd
  // server that hands them connections, so that each goes in the right order.
  std::unique_ptr<ControlLanes> lanes;
  std::unique_ptr<FdServer> fd_server;
  std::unique_ptr<PeerAcceptor> acceptor;  // feeds admitted control connections to `server`
  absl::Notification shutdown;
  std::atomic<bool> drained{false};  // the shutdown came from a drain going idle
  std::once_flag shutdown_once;
  // Whether an idle drain stops the daemon, and whether it is stopping: a cancel and a drain going
  // idle decide under this lock, so a cancelled drain never exits and a stopping daemon never
  // turns SERVING again. Taken before health_mu, never inside it.
  absl::Mutex drain_mu;
  bool exit_when_idle ABSL_GUARDED_BY(drain_mu) = false;
  bool stopping ABSL_GUARDED_BY(drain_mu) = false;

  // Health is SERVING while the daemon is ready (started, not draining or stopping) and both
  // sockets accept; the acceptors report their state from their own threads.
  enum Channel { kFdChannel = 1, kControlSocket = 2 };
  absl::Mutex health_mu;
  grpc::HealthCheckServiceInterface* health ABSL_GUARDED_BY(health_mu) = nullptr;  // `server`'s
  bool ready ABSL_GUARDED_BY(health_mu) = false;
  int channels_down ABSL_GUARDED_BY(health_mu) = 0;  // Channel bits
  void SetReady(bool now_ready) ABSL_LOCKS_EXCLUDED(health_mu) {
    absl::MutexLock lock(&health_mu);
    ready = now_ready;
    PublishHealthLocked();
  }
  void SetChannelUp(Channel channel, bool up) ABSL_LOCKS_EXCLUDED(health_mu) {
    absl::MutexLock lock(&health_mu);
    const int before = channels_down;
    channels_down = up ? channels_down & ~channel : channels_down | channel;
    if (channels_down != before) PublishHealthLocked();
  }
  // gRPC's health service is in-process state; setting it under the lock keeps updates ordered.
  void PublishHealthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_mu) {
    if (health != nullptr) health->SetServingStatus(ready && channels_down == 0);
    metrics->SetServing(health != nullptr && ready && channels_down == 0);  // hisparse_serving
  }

  // Start's phases, in the order it runs them (Daemon::Start).
  // The host pool, with the slabs a former daemon left (or without them, if it cannot take them
  // back), and the request journal of this life; sets auto_host_arena_bytes.
  absl::StatusOr<std::unique_ptr<PagePool>> CreatePool(const DaemonConfig& config, StartRecovery& recovery);
  // The session manager over `pool`, the durable requests restored into it, the lease sweeper.
  void StartSessions(SessionManager::Options options, std::unique_ptr<PagePool> pool, StartRecovery& recovery);
  // The import target (import.enabled), or a log line saying why imports are off.
  void StartImports(const DaemonConfig& config);
  // The service's hooks into the daemon: config, reload status, lanes, and drain through
  // `drain_target` (the Daemon, once Start has made it).
  HiSparseService::Hooks ServiceHooks(const std::shared_ptr<std::atomic<Daemon*>>& drain_target);
  // The control socket: gRPC served on the connections that `policy` admits.
  absl::Status StartControlSocket(const DaemonConfig& config, const std::string& socket_path, gid_t socket_gid,
                                  const AccessPolicy& policy);
};

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() {
  Shutdown();
  if (impl_->drainer.joinable()) impl_->drainer.join();
}

namespace {

// The options the session manager takes from the config and this start (its GPU ones aside).
SessionManager::Options SessionOptionsFrom(const DaemonConfig& config, const std::string& fd_socket_path,
                                           uint64_t auto_host_arena_bytes, const StartRecovery& recovery) {
  SessionManager::Options o;
  o.max_sessions = static_cast<uint32_t>(config.limits.max_sessions);
  o.max_requests_per_session = static_cast<uint32_t>(config.limits.max_requests_per_session);
  o.max_tokens_per_request = static_cast<uint32_t>(config.limits.max_tokens_per_request);
  o.fd_socket_path = fd_socket_path;
  o.arena_budget_bytes = config.gpu_memory_budget;
  o.host_arena_budget_bytes =
      config.limits.host_arena_bytes != 0 ? config.limits.host_arena_bytes : auto_host_arena_bytes;
  o.quotas = QuotasFrom(config);
  o.evict_on_pool_full = config.admission.on_pool_full == OnPoolFull::kEvictLruIdle;
  o.version = kVersion;
  o.import_grant_ttl = absl::Seconds(config.import.grant_ttl);
  o.max_lease_seconds = static_cast<uint32_t>(config.durability.max_lease_seconds);
  o.max_orphans_per_tenant = static_cast<uint32_t>(config.durability.max_orphans_per_tenant);
  o.first_session_id = recovery.FirstId();
  return o;
}

PagePool::Options PoolOptionsFrom(const HostPoolConfig& c) {
  PagePool::Options o;
  o.budget_bytes = c.size;
  o.page_bytes = c.page_size;
  o.slab_bytes = c.slab_size;
  o.reserve_slabs = static_cast<uint32_t>(c.reserve_slabs);
  o.hugepages = c.hugepages == HugePagesMode::kOn    ? PagePool::Hugepages::kOn
                : c.hugepages == HugePagesMode::kOff ? PagePool::Hugepages::kOff
                                                     : PagePool::Hugepages::kAuto;
  o.pretouch_threads = c.pretouch_threads;
  o.mlock = c.mlock;
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PagePool>> Daemon::Impl::CreatePool(const DaemonConfig& config,
                                                                   StartRecovery& recovery) {
  PagePool::Options pool_options = PoolOptionsFrom(config.host_pool);
  HS_ASSIGN_OR_RETURN(auto_host_arena_bytes,
                      CheckMemoryAtStart(config.host_pool.size, pool_options.hugepages != PagePool::Hugepages::kOff,
                                         recovery.HeldBytes(config.host_pool.page_size)));
  pool_options.first_slab_id = recovery.FirstId();
  RecoveryPlan& plan = recovery.plan;
  std::vector<std::string> taken;  // the store's names of the slabs the pool takes back
  for (const PagePool::RecoveredSlab& slab : plan.slabs) taken.push_back(RequestJournal::SlabName(slab.id));
  absl::StatusOr<std::unique_ptr<PagePool>> created = PagePool::Create(pool_options, std::move(plan.slabs));
  if (!created.ok() && !plan.puts.empty()) {
    LOG(ERROR) << "restart: the pool cannot take the recovered slabs back (" << created.status()
               << "): no durable request is recovered";
    plan.dropped_requests += plan.puts.size();
    plan.puts.clear();
    // Out of the store too, or their memory would wait there until the next restart.
    plan.stale_names.insert(plan.stale_names.end(), taken.begin(), taken.end());
    created = PagePool::Create(pool_options);
  }
  HS_ASSIGN_OR_RETURN(std::unique_ptr<PagePool> pool, std::move(created));
  if (recovery.store != nullptr) {
    absl::StatusOr<std::unique_ptr<RequestJournal>> started = StartJournal(recovery, config.host_pool.page_size);
    if (started.ok()) {
      journal = *std::move(started);
    } else {
      LOG(ERROR) << "the request journal cannot start (" << started.status()
                 << "): durable requests will not outlive this process";
    }
  }
  return pool;
}

void Daemon::Impl::StartSessions(SessionManager::Options options, std::unique_ptr<PagePool> pool,
                                 StartRecovery& recovery) {
  options.journal = journal.get();
  sessions = std::make_unique<SessionManager>(options, std::move(pool));
  const RecoveryPlan& plan = recovery.plan;
  size_t recovered = 0;
  if (!plan.puts.empty()) {
    absl::StatusOr<size_t> restored = sessions->RestoreOrphans(plan.puts);
    if (restored.ok()) {
      recovered = *restored;
      LOG(INFO) << "restart: " << recovered << " durable requests recovered from the former daemon";
    } else {
      LOG(ERROR) << "restart: restoring the recovered requests failed: " << restored.status();
    }
  }
  if (journal != nullptr) {
    // Requests found but not taken back: dropped by the plan, or by the restore (a tenant's cap).
    const uint64_t found = plan.puts.size() + plan.dropped_requests;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - recovery.started);
    journal->NoteRecovery(recovered, found > recovered ? found - recovered : 0, !plan.refused.empty(), seconds);
    if (plan.found) LOG(INFO) << "restart: recovery took " << seconds * 1e3 << " ms";
  }
  lease_sweeper = std::make_unique<LeaseSweeper>(sessions.get());
}

void Daemon::Impl::StartImports(const DaemonConfig& config) {
  if (!config.import.enabled) {
    LOG(INFO) << "imports are off: import.enabled is false";
    return;
  }
  SessionManager* manager = sessions.get();
  ImportTargetOptions import_options;
  import_options.worker_binary = ImportWorkerBinary();
  import_options.ucx_tls = config.import.ucx_tls;
  import_options.ucx_net_devices = config.import.ucx_net_devices;
  import_options.worker_memory_bytes = config.import.worker_memory;
  import_options.on_tick = [manager] { manager->ExpireImports(); };
  import_options.on_lost = [manager](const std::vector<std::string>& ids, const std::string& reason) {
    manager->AbortLostImports(ids, reason);
  };
  auto target = StartImportTarget(import_options);
  if (target.ok()) {
    import_target = std::move(*target);
    manager->SetImportTarget(import_target.get());
  } else if (absl::IsUnimplemented(target.status())) {
    LOG(INFO) << "imports are off: " << target.status().message();
  } else {
    LOG(WARNING) << "imports are off (import.enabled is true): " << target.status().message();
  }
}

HiSparseService::Hooks Daemon::Impl::ServiceHooks(const std::shared_ptr<std::atomic<Daemon*>>& drain_target) {
  HiSparseService::Hooks hooks;
  hooks.config_yaml = [this] {
    absl::MutexLock lock(&config_mu);
    return RenderConfigYaml(config);
  };
  hooks.reload = [this] {
    absl::MutexLock lock(&config_mu);
    return reload;
  };
  hooks.session_ended = [this](uint64_t session_id) { lanes->SessionEnded(session_id); };
  // Atomic: the server may take a Drain call before Start has stored the Daemon (TSan saw it).
  hooks.drain = [drain_target](bool exit_when_idle) {
    Daemon* d = drain_target->load(std::memory_order_acquire);
    if (d == nullptr) return false;  // still starting: the caller is told to retry
    d->Drain(exit_when_idle);
    return true;
  };
  hooks.cancel_drain = [drain_target]() -> absl::Status {
    Daemon* d = drain_target->load(std::memory_order_acquire);
    if (d == nullptr) return absl::UnavailableError("the daemon is still starting; retry");
    return d->CancelDrain();
  };
  return hooks;
}

absl::Status Daemon::Impl::StartControlSocket(const DaemonConfig& config, const std::string& socket_path,
                                              gid_t socket_gid, const AccessPolicy& policy) {
  // The daemon accepts on the control socket itself, reads each peer's credentials (SO_PEERCRED),
  // and hands only admitted connections to gRPC: no RPC, admin ones included, is reachable by a
  // peer the access policy refuses.
  auto listener = ListenUnixStream(socket_path, kSocketMode, socket_gid);
  if (!listener.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", grpc_address, ": ", listener.status().message(),
                                               " (does the directory exist and is it writable?)"));
  }
  grpc::ServerBuilder builder;
  grpc_threads.SetMaxThreads(GrpcThreadLimit(config.limits.max_sessions));
  builder.SetResourceQuota(grpc_threads);
  builder.RegisterService(service.get());
  server = builder.BuildAndStart();
  if (server == nullptr) return absl::InternalError("the gRPC server did not start");
  grpc::Server* grpc_server = server.get();
  PeerAcceptor::Options acceptor_options;
  acceptor_options.max_connections_per_peer = config.limits.max_control_connections_per_peer;
  acceptor_options.on_serving_change = [this](bool up) { SetChannelUp(kControlSocket, up); };
  // The acceptor has recorded the connection's peer in `peers` (and counted it) before this runs:
  // its first RPC may arrive as soon as gRPC has it.
  HS_ASSIGN_OR_RETURN(acceptor, PeerAcceptor::Start(
                                    std::move(*listener), policy, &peers,
                                    [grpc_server](int fd, const PeerCredentials&) {
                                      // gRPC's event engine drives the connection with non-blocking I/O.
                                      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
                                      grpc::AddInsecureChannelFromFd(grpc_server, fd);
                                    },
                                    std::move(acceptor_options)));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config, const std::string& node) {
  HS_RETURN_IF_ERROR(ValidateConfig(config));
  auto impl = std::make_unique<Impl>();
  {
    absl::MutexLock lock(&impl->config_mu);
    impl->config = config;
  }
  SetLogThreshold(static_cast<LogSeverity>(static_cast<int>(config.log_level)));
  const std::string socket_path(ListenSocketPath(config.listen));
  impl->grpc_address = absl::StrCat("unix:", socket_path);
  impl->fd_socket_path = socket_path + ".fd";
  // One daemon per socket path, decided before anything else is made: a second one would replace
  // the sockets and orphan the first daemon with its pool.
  absl::StatusOr<PathLock> lock = PathLock::Acquire(socket_path + ".lock");
  if (!lock.ok()) {
    if (absl::IsFailedPrecondition(lock.status())) return lock.status();
    return absl::UnavailableError(absl::StrCat("cannot lock ", socket_path, ".lock: ", lock.status().message(),
                                               " (does the directory exist and is it writable?)"));
  }
  impl->socket_lock = *std::move(lock);

  // The slot arena of every session that declares a GPU goes in that GPU's memory (CUDA VMM,
  // exported to the engine as an fd) under device cuda, and under auto when this process sees a
  // GPU; device host keeps host-memory arenas (ChooseDevice has the cases).
  GpuArenaAllocator gpu_arena_allocator;
  GpuProbe probe;
  if (config.device != DeviceKind::kHost) {
    const ArenaExport mode = config.gpu.arena_export == ArenaExportMode::kVmm       ? ArenaExport::kVmm
                             : config.gpu.arena_export == ArenaExportMode::kCudaIpc ? ArenaExport::kCudaIpc
                                                                                    : ArenaExport::kAuto;
    absl::StatusOr<GpuArenaAllocator> vmm = MakeCudaArenaAllocator(mode, &probe.gpus);
    probe.status = vmm.status();
    probe.driver = SeeCudaDriver();
    if (vmm.ok()) gpu_arena_allocator = *std::move(vmm);
  }
  HS_ASSIGN_OR_RETURN(const DeviceChoice choice, ChooseDevice(config.device, probe));
  if (!choice.gpu_arenas) gpu_arena_allocator = nullptr;
  const std::string device = choice.device();
  if (choice.gpu_arenas) {
    LOG(INFO) << choice.why << ", gpu.arena_export: " << ArenaExportModeName(config.gpu.arena_export);
  } else if (choice.warn) {
    LOG(WARNING) << choice.why;
  } else {
    LOG(INFO) << choice.why;
  }

  StartRecovery recovery = TakeStoredFds(config);
  HS_ASSIGN_OR_RETURN(std::unique_ptr<PagePool> pool, impl->CreatePool(config, recovery));
  SessionManager::Options sm_options =
      SessionOptionsFrom(config, impl->fd_socket_path, impl->auto_host_arena_bytes, recovery);
  sm_options.device = choice.gpu_arenas ? DeviceKind::kCuda : DeviceKind::kHost;
  if (gpu_arena_allocator != nullptr) {
    // Sessions name their GPU by UUID too (an engine pod's ordinal 0 is any of the node's GPUs).
    absl::StatusOr<std::vector<std::string>> uuids = CudaGpuUuids();
    if (uuids.ok()) {
      sm_options.gpu_uuids = *std::move(uuids);
    } else {
      LOG(WARNING) << "cannot read the GPUs' UUIDs (" << uuids.status()
                   << "): sessions' GPU ordinals are taken as this daemon's";
    }
  }
  sm_options.gpu_arena_allocator = std::move(gpu_arena_allocator);
  impl->StartSessions(std::move(sm_options), std::move(pool), recovery);
  impl->metrics = std::make_shared<Metrics>(impl->sessions.get(), node);
  // Before either socket exists: a metrics address that cannot be bound stops the start with
  // nothing left behind.
  if (!config.metrics.listen.empty()) {
    HS_ASSIGN_OR_RETURN(impl->metrics_server, MetricsServer::Start(config.metrics.listen, impl->metrics));
    const std::vector<int> ports = impl->metrics_server->ListeningPorts();  // port 0: the one taken
    const std::string host = config.metrics.listen.substr(0, config.metrics.listen.rfind(':'));
    LOG(INFO) << "metrics on http://" << host << ":" << (ports.empty() ? 0 : ports.front()) << "/metrics";
  }
  impl->StartImports(config);

  HS_ASSIGN_OR_RETURN(const gid_t socket_gid, ResolveGroup(config.access.socket_group));
  const AccessPolicy policy(config.access.allowed_uids, config.access.allowed_gids, config.access.admin_uids,
                            config.access.admin_gids);
  Impl* raw = impl.get();
  FdServer::Options fd_options;
  fd_options.max_connections_per_peer = config.limits.max_fd_connections_per_peer;
  fd_options.in_flight = FdInFlightFrom(config.limits);
  fd_options.on_serving_change = [raw](bool up) { raw->SetChannelUp(Impl::kFdChannel, up); };
  impl->lanes = std::make_unique<ControlLanes>(impl->sessions.get(), impl->metrics.get());
  impl->lanes->SetEnabled(config.limits.control_lanes);
  fd_options.lanes = impl->lanes.get();
  // From here a start that fails removes the sockets it made (Shutdown does, once started): the
  // next start, or an engine, must not find a stale one.
  struct RemoveOnFailure {
    std::vector<std::string> paths;
    ~RemoveOnFailure() {
      for (const std::string& p : paths) ::unlink(p.c_str());
    }
  } remove_on_failure{{impl->fd_socket_path, socket_path}};
  HS_ASSIGN_OR_RETURN(impl->fd_server, FdServer::Start(impl->fd_socket_path, kSocketMode, socket_gid, policy,
                                                       impl->sessions.get(), std::move(fd_options)));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Drain is wired to the Daemon once it exists (it needs `this`), below.
  auto drain_target = std::make_shared<std::atomic<Daemon*>>(nullptr);
  impl->stream_gate = std::make_unique<SessionStreamGate>(GateLimitsFrom(config.limits));
  impl->service = std::make_unique<HiSparseService>(impl->sessions.get(), impl->metrics.get(), &impl->peers, policy,
                                                    impl->ServiceHooks(drain_target), impl->stream_gate.get());
  HS_RETURN_IF_ERROR(impl->StartControlSocket(config, socket_path, socket_gid, policy));
  // Pools are ready: only now do health checks see SERVING.
  {
    absl::MutexLock lock(&impl->health_mu);
    impl->health = impl->server->GetHealthCheckService();
    impl->health->SetServingStatus("hisparse.v1.HiSparse", false);  // named here; SetReady sets all
  }
  impl->SetReady(true);
  LOG(INFO) << "hisparsed " << kVersion << " serving on " << impl->grpc_address << " (fd channel "
            << impl->fd_socket_path << ", device " << device << (node.empty() ? "" : ", node ") << node << ")";
  remove_on_failure.paths.clear();
  std::unique_ptr<Daemon> daemon(new Daemon(std::move(impl)));
  drain_target->store(daemon.get(), std::memory_order_release);
  return daemon;
}

void Daemon::Drain(bool exit_when_idle) {
  {
    // A later drain decides for the earlier one (SetDraining replaces the idle callback too).
    absl::MutexLock lock(&impl_->drain_mu);
    impl_->exit_when_idle = exit_when_idle;
  }
  impl_->SetReady(false);
  LOG(INFO) << "draining: no new sessions or admissions" << (exit_when_idle ? "; exiting once idle" : "");
  std::function<void()> on_idle;
  if (exit_when_idle) {
    // Shutdown waits for RPC handlers, so it must not run on one (or under the session core's lock).
    on_idle = [this] {
      DeferredLog log;  // written once the lock is released
      absl::MutexLock lock(&impl_->drain_mu);
      // Cancelled (CancelDrain) since this callback was taken, or stopping already: nothing to do.
      if (!impl_->exit_when_idle || impl_->stopping) return;
      impl_->stopping = true;
      impl_->drained.store(true);
      try {
        impl_->drainer = std::thread([this] { Shutdown(); });
      } catch (const std::system_error& e) {
        // Out of threads: keep serving, drained; SIGTERM still stops the daemon.
        impl_->drained.store(false);
        impl_->stopping = false;
        impl_->exit_when_idle = false;
        DEFERRED_LOG(log, ERROR) << "drain: cannot start the thread that stops the daemon once idle: " << e.what();
      }
    };
  }
  impl_->sessions->SetDraining(true, std::move(on_idle));
}

absl::Status Daemon::CancelDrain() {
  DeferredLog log;  // written once the lock is released
  absl::MutexLock lock(&impl_->drain_mu);
  if (impl_->stopping) {
    return absl::FailedPreconditionError(
        impl_->drained.load() ? "the drain went idle already: the daemon is exiting 75 for its service manager to "
                                "start it again"
                              : "the daemon is stopping");
  }
  impl_->exit_when_idle = false;
  impl_->sessions->SetDraining(false);  // drops the idle callback too
  impl_->SetReady(true);
  DEFERRED_LOG(log, INFO) << "drain cancelled: admitting sessions and requests again";
  return absl::OkStatus();
}

std::vector<std::string> Daemon::Reload(const DaemonConfig& next) {
  std::vector<std::string> fixed;
  DeferredLog log;  // written once the lock is released
  absl::MutexLock lock(&impl_->config_mu);
  DaemonConfig& cur = impl_->config;
  // Every change a reload makes to the limits, quotas and admission policy is logged.
  DaemonConfig live = cur;
  live.log_level = next.log_level;
  live.limits = next.limits;
  // The page-table stride of every session derives from it at start-up: a restart applies it.
  live.limits.max_tokens_per_request = cur.limits.max_tokens_per_request;
  live.quotas = next.quotas;
  live.admission = next.admission;
  live.durability.max_lease_seconds = next.durability.max_lease_seconds;
  live.durability.max_orphans_per_tenant = next.durability.max_orphans_per_tenant;
  for (const std::string& change : DescribeConfigChanges(cur, live)) DEFERRED_LOG(log, INFO) << "reload: " << change;
  if (next.log_level != cur.log_level) {
    cur.log_level = next.log_level;
    SetLogThreshold(static_cast<LogSeverity>(static_cast<int>(next.log_level)));
  }
  // Limits, quotas and the admission policy change live: they are checked at each admission.
  cur.limits = live.limits;
  cur.quotas = next.quotas;
  cur.admission = next.admission;
  // The lease bound is checked at each SetLease and admission; granted leases keep their deadline.
  cur.durability.max_lease_seconds = next.durability.max_lease_seconds;
  impl_->sessions->SetMaxLeaseSeconds(static_cast<uint32_t>(next.durability.max_lease_seconds));
  // The orphan cap is checked as each session ends; orphans kept already stay.
  cur.durability.max_orphans_per_tenant = next.durability.max_orphans_per_tenant;
  impl_->sessions->SetMaxOrphansPerTenant(static_cast<uint32_t>(next.durability.max_orphans_per_tenant));
  impl_->fd_server->SetMaxConnectionsPerPeer(next.limits.max_fd_connections_per_peer);
  impl_->fd_server->SetInFlightLimits(FdInFlightFrom(next.limits));
  impl_->lanes->SetEnabled(next.limits.control_lanes);
  impl_->acceptor->SetMaxConnectionsPerPeer(next.limits.max_control_connections_per_peer);
  impl_->stream_gate->SetLimits(GateLimitsFrom(next.limits));
  impl_->grpc_threads.SetMaxThreads(GrpcThreadLimit(next.limits.max_sessions));
  impl_->sessions->SetHostArenaBudget(next.limits.host_arena_bytes != 0 ? next.limits.host_arena_bytes
                                                                        : impl_->auto_host_arena_bytes);
  impl_->sessions->SetLimits(static_cast<uint32_t>(next.limits.max_sessions),
                             static_cast<uint32_t>(next.limits.max_requests_per_session), QuotasFrom(next),
                             next.admission.on_pool_full == OnPoolFull::kEvictLruIdle);
  // Everything else shapes memory or sockets already in use: it needs a restart. Each stays
  // pending (Stats, GetConfig, hisparse_config_restart_pending_keys) until a reload finds the file
  // back at the running value, or a restart applies it.
  v1::ConfigReloadStatus& reload = impl_->reload;
  reload.Clear();
  reload.set_time_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  reload.set_ok(true);
  for (std::string& key : DiffConfigKeys(cur, next)) {
    DEFERRED_LOG(log, WARNING) << "reload: " << key << " cannot change while running; restart hisparsed to apply it";
    v1::PendingRestartKey* pending = reload.add_pending_restart();
    pending->set_key(key);
    pending->set_running(ConfigKeyValue(cur, key));
    pending->set_file(ConfigKeyValue(next, key));
    fixed.push_back(std::move(key));
  }
  impl_->metrics->SetRestartPendingKeys(fixed.size());
  impl_->metrics->ObserveReload(true);
  return fixed;
}

void Daemon::ReloadRefused(const absl::Status& why) {
  LOG(ERROR) << "SIGHUP: keeping the running config: " << why;
  {
    // The keys pending a restart stay as the last applied reload found them: the file was not read.
    absl::MutexLock lock(&impl_->config_mu);
    impl_->reload.set_time_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    impl_->reload.set_ok(false);
    impl_->reload.set_error(std::string(why.message()));
  }
  impl_->metrics->ObserveReload(false);
}

DaemonConfig Daemon::config() const {
  absl::MutexLock lock(&impl_->config_mu);
  return impl_->config;
}

void Daemon::Wait() { impl_->shutdown.WaitForNotification(); }

bool Daemon::drained() const { return impl_->drained.load(); }

void Daemon::Shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    {
      absl::MutexLock lock(&impl_->drain_mu);  // a drain cancelled from here on is refused
      impl_->stopping = true;
    }
    impl_->SetReady(false);
    impl_->sessions->SetDraining(true);
    impl_->acceptor->Stop();
    // Streams blocked in Read() are cancelled after the deadline; their handlers close sessions.
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    impl_->server->Wait();
    impl_->fd_server->Stop();
    impl_->lanes->Stop();  // after the fd server, the only one that opens lanes
    impl_->metrics_server.reset();
    ::unlink(ListenSocketPath(impl_->grpc_address).data());
    ::unlink(impl_->fd_socket_path.c_str());
    impl_->shutdown.Notify();
  });
}

const std::string& Daemon::grpc_address() const { return impl_->grpc_address; }
const std::string& Daemon::fd_socket_path() const { return impl_->fd_socket_path; }
SessionManager* Daemon::sessions() { return impl_->sessions.get(); }

}  // namespace hisparse
