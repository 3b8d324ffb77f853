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
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/access.h"
#include "hisparse/daemon/fd_server.h"
#include "hisparse/daemon/host_pool.h"
#include "hisparse/daemon/metrics.h"
#include "hisparse/daemon/service.h"
#include "hisparse/daemon/session_manager.h"

namespace hisparse {

inline constexpr char kVersion[] = "0.1.0";

SessionManager::QuotaOptions QuotasFrom(const DaemonConfig& c) {
  return SessionManager::QuotaOptions{
      c.quotas.host_bytes, c.quotas.arena_bytes, static_cast<uint32_t>(c.quotas.requests),
      static_cast<uint32_t>(c.quotas.sessions), static_cast<uint32_t>(c.quotas.segments)};
}
// Engines and the daemon share these sockets; the group decides who may attach (issue: access).
inline constexpr mode_t kSocketMode = 0660;

struct Daemon::Impl {
  mutable absl::Mutex config_mu;
  DaemonConfig config ABSL_GUARDED_BY(config_mu);
  std::string grpc_address;
  std::string fd_socket_path;
  std::unique_ptr<SessionManager> sessions;
  std::shared_ptr<Metrics> metrics;
  std::unique_ptr<MetricsServer> metrics_server;
  std::unique_ptr<HiSparseService> service;
  std::thread drainer;  // runs Shutdown when a drain with exit_when_idle goes idle
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<FdServer> fd_server;
  std::unique_ptr<PeerAcceptor> acceptor;  // feeds admitted control connections to `server`
  absl::Notification shutdown;
  std::once_flag shutdown_once;
};

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() {
  Shutdown();
  if (impl_->drainer.joinable()) impl_->drainer.join();
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
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

  // device: cuda puts the slot arena of every session that declares a GPU in that GPU's memory
  // (CUDA VMM, exported to the engine as an fd). auto and host keep host-memory arenas: an engine
  // on the host-emulated backend may declare a GPU index too, and could not map GPU memory.
  std::string device = "host";
  GpuArenaAllocator gpu_arena_allocator;
  if (config.device == DeviceKind::kCuda) {
    int gpus = 0;
    const ArenaExport mode = config.gpu.arena_export == ArenaExportMode::kVmm       ? ArenaExport::kVmm
                             : config.gpu.arena_export == ArenaExportMode::kCudaIpc ? ArenaExport::kCudaIpc
                                                                                    : ArenaExport::kAuto;
    absl::StatusOr<GpuArenaAllocator> vmm = MakeCudaArenaAllocator(mode, &gpus);
    if (!vmm.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device: cuda, but GPU slot arenas are unavailable: ", vmm.status().message()));
    }
    gpu_arena_allocator = *std::move(vmm);
    device = "cuda";
    LOG(INFO) << "device cuda: slot arenas in GPU memory on " << gpus
              << " GPU(s), gpu.arena_export: " << ArenaExportModeName(config.gpu.arena_export);
  }

  const PoolGeometry geometry = HostPoolGeometry(config.host_pool);
  HostPool::Options pool_options;
  pool_options.size_bytes = geometry.total_bytes;
  pool_options.segment_bytes = geometry.segment_size;
  pool_options.hugepages = config.host_pool.hugepages == HugePagesMode::kOn    ? HostPool::Hugepages::kOn
                           : config.host_pool.hugepages == HugePagesMode::kOff ? HostPool::Hugepages::kOff
                                                                               : HostPool::Hugepages::kAuto;
  pool_options.pretouch_threads = config.host_pool.pretouch_threads;
  pool_options.mlock = config.host_pool.mlock;
  HS_ASSIGN_OR_RETURN(std::unique_ptr<HostPool> pool, HostPool::Create(pool_options));

  SessionManager::Options sm_options;
  sm_options.max_sessions = static_cast<uint32_t>(config.limits.max_sessions);
  sm_options.max_requests_per_session = static_cast<uint32_t>(config.limits.max_requests_per_session);
  sm_options.fd_socket_path = impl->fd_socket_path;
  sm_options.arena_budget_bytes = config.gpu_memory_budget;
  sm_options.quotas = QuotasFrom(config);
  sm_options.evict_on_pool_full = config.admission.on_pool_full == OnPoolFull::kEvictLruIdle;
  sm_options.device = device;
  sm_options.gpu_arena_allocator = std::move(gpu_arena_allocator);
  sm_options.version = kVersion;
  impl->sessions = std::make_unique<SessionManager>(sm_options, std::move(pool));

  HS_ASSIGN_OR_RETURN(const gid_t socket_gid, ResolveGroup(config.access.socket_group));
  const AccessPolicy policy(config.access.allowed_uids, config.access.allowed_gids);
  HS_ASSIGN_OR_RETURN(impl->fd_server,
                      FdServer::Start(impl->fd_socket_path, kSocketMode, socket_gid, policy, impl->sessions.get()));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  impl->metrics = std::make_shared<Metrics>(impl->sessions.get());
  if (!config.metrics.listen.empty()) {
    HS_ASSIGN_OR_RETURN(impl->metrics_server, MetricsServer::Start(config.metrics.listen, impl->metrics));
    LOG(INFO) << "metrics on http://" << config.metrics.listen << "/metrics";
  }
  Impl* raw = impl.get();
  HiSparseService::Hooks hooks;
  hooks.config_yaml = [raw] {
    absl::MutexLock lock(&raw->config_mu);
    return RenderConfigYaml(raw->config);
  };
  // Drain is wired after the Daemon object exists (it needs `this`); see below.
  // Atomic: the server may take a Drain call before Start has stored the Daemon (TSan saw it).
  auto drain_target = std::make_shared<std::atomic<Daemon*>>(nullptr);
  hooks.drain = [drain_target](bool exit_when_idle) {
    Daemon* d = drain_target->load(std::memory_order_acquire);
    if (d == nullptr) return false;  // still starting: the caller is told to retry
    d->Drain(exit_when_idle);
    return true;
  };
  impl->service = std::make_unique<HiSparseService>(impl->sessions.get(), impl->metrics.get(), std::move(hooks));
  // The daemon accepts on the control socket itself, reads each peer's credentials (SO_PEERCRED),
  // and hands only admitted connections to gRPC: no RPC, admin ones included, is reachable by a
  // peer the access policy refuses.
  auto listener = ListenUnixStream(socket_path, kSocketMode, socket_gid);
  if (!listener.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", impl->grpc_address, ": ",
                                               listener.status().message(),
                                               " (does the directory exist and is it writable?)"));
  }
  grpc::ServerBuilder builder;
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr) return absl::InternalError("the gRPC server did not start");
  grpc::Server* server = impl->server.get();
  impl->acceptor = PeerAcceptor::Start(std::move(*listener), policy, [server](int fd) {
    // gRPC's event engine drives the connection with non-blocking I/O.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    grpc::AddInsecureChannelFromFd(server, fd);
  });
  // Pools are ready: only now do health checks see SERVING.
  impl->server->GetHealthCheckService()->SetServingStatus(true);
  impl->server->GetHealthCheckService()->SetServingStatus("hisparse.v1.HiSparse", true);
  LOG(INFO) << "hisparsed " << kVersion << " serving on " << impl->grpc_address << " (fd channel "
            << impl->fd_socket_path << ", device " << device << ")";
  std::unique_ptr<Daemon> daemon(new Daemon(std::move(impl)));
  drain_target->store(daemon.get(), std::memory_order_release);
  return daemon;
}

void Daemon::Drain(bool exit_when_idle) {
  impl_->server->GetHealthCheckService()->SetServingStatus(false);
  LOG(INFO) << "draining: no new sessions or admissions" << (exit_when_idle ? "; exiting once idle" : "");
  std::function<void()> on_idle;
  if (exit_when_idle) {
    // Shutdown waits for RPC handlers, so it must not run on one (or under the manager's lock).
    on_idle = [this] {
      static std::once_flag once;
      std::call_once(once, [this] { impl_->drainer = std::thread([this] { Shutdown(); }); });
    };
  }
  impl_->sessions->SetDraining(true, std::move(on_idle));
}

std::vector<std::string> Daemon::Reload(const DaemonConfig& next) {
  std::vector<std::string> fixed;
  absl::MutexLock lock(&impl_->config_mu);
  DaemonConfig& cur = impl_->config;
  // Every change a reload makes to the limits, quotas and admission policy is logged.
  DaemonConfig live = cur;
  live.log_level = next.log_level;
  live.limits = next.limits;
  live.quotas = next.quotas;
  live.admission = next.admission;
  for (const std::string& change : DescribeConfigChanges(cur, live)) LOG(INFO) << "reload: " << change;
  if (next.log_level != cur.log_level) {
    cur.log_level = next.log_level;
    SetLogThreshold(static_cast<LogSeverity>(static_cast<int>(next.log_level)));
  }
  // Limits, quotas and the admission policy change live: they are checked at each admission.
  cur.limits = next.limits;
  cur.quotas = next.quotas;
  cur.admission = next.admission;
  impl_->sessions->SetLimits(static_cast<uint32_t>(next.limits.max_sessions),
                             static_cast<uint32_t>(next.limits.max_requests_per_session), QuotasFrom(next),
                             next.admission.on_pool_full == OnPoolFull::kEvictLruIdle);
  // Everything else shapes memory or sockets already in use: it needs a restart.
  for (std::string& key : DiffConfigKeys(cur, next)) {
    LOG(WARNING) << "reload: " << key << " cannot change while running; restart hisparsed to apply it";
    fixed.push_back(std::move(key));
  }
  return fixed;
}

DaemonConfig Daemon::config() const {
  absl::MutexLock lock(&impl_->config_mu);
  return impl_->config;
}

void Daemon::Wait() { impl_->shutdown.WaitForNotification(); }

void Daemon::Shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    impl_->server->GetHealthCheckService()->SetServingStatus(false);
    impl_->sessions->SetDraining(true);
    impl_->acceptor->Stop();
    // Streams blocked in Read() are cancelled after the deadline; their handlers close sessions.
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    impl_->server->Wait();
    impl_->fd_server->Stop();
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
