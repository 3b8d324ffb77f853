// DaemonConfig: hisparsed's settings, read from a YAML file and overridden by command-line flags.
//
// One table (ConfigKeys()) names every key, its default and its help; the parser, the override
// path, the renderer, the docs and deploy/hisparsed.yaml all follow it, so a key is added in one
// place (config.cc) and a test holds the example file to it.
//
// Values are plain data, copied freely. The functions are pure (LoadConfigFile reads one file)
// and safe to call from any thread. No exception escapes them: yaml-cpp's are caught here.
//
// Order at start-up: LoadConfigFile (or ParseConfigYaml, or DaemonConfig{} without a file) ->
// ApplyConfigOverride for each flag -> ValidateConfig. Errors are InvalidArgument (NotFound or
// PermissionDenied etc. for an unreadable file) and start with the full dotted key, e.g.
//   host_pool.size: cannot parse "12XB" as a byte size: unknown unit "XB"
#ifndef HISPARSE_DAEMON_CONFIG_H_
#define HISPARSE_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hisparse {

// host_pool.hugepages. kAuto tries MFD_HUGETLB and falls back to normal pages quietly (most hosts
// reserve no huge pages); kOn makes start-up fail when huge pages cannot be had.
enum class HugePagesMode { kAuto, kOn, kOff };
// device: where GPU sessions' slot arenas live (ChooseDevice, device_choice.h). kCuda: GPU
// memory, start fails without a usable GPU; kAuto: GPU memory when the daemon sees a usable GPU,
// else host memory (logged); kHost: host memory always.
enum class DeviceKind { kAuto, kCuda, kHost };
// gpu.arena_export (device cuda or auto): how a GPU slot arena is shared with its engine. kAuto uses CUDA
// VMM with POSIX-fd export where the GPU supports it and legacy cudaIpc handles elsewhere; kVmm
// and kCudaIpc force one (kVmm fails session open on a GPU without fd export).
enum class ArenaExportMode { kAuto, kVmm, kCudaIpc };
enum class LogLevel { kDebug, kInfo, kWarning, kError };
// log_format: one text line per message, or one JSON object per line (log.h has both shapes).
enum class LogFormatKind { kText, kJson };
// log_priority_prefix: "<N>" syslog priorities on each line for journald; kAuto when stderr is
// the journal (systemd's JOURNAL_STREAM).
enum class LogPrefixMode { kAuto, kOn, kOff };

// The YAML spelling of each value: "auto", "on", "cuda", "warning", ...
std::string_view HugePagesModeName(HugePagesMode mode);
std::string_view DeviceKindName(DeviceKind kind);
std::string_view ArenaExportModeName(ArenaExportMode mode);
std::string_view LogLevelName(LogLevel level);
std::string_view LogFormatKindName(LogFormatKind format);
std::string_view LogPrefixModeName(LogPrefixMode mode);

struct HostPoolConfig {
  // The host KV pool's budget: every session's pages, the reserve and slabs being made together.
  uint64_t size = uint64_t{1} << 30;
  // Pages handed to requests (a record never straddles one); sessions' slabs are whole pages.
  uint64_t page_size = uint64_t{256} << 10;
  // The largest slab (one memfd of one session), and the size of the reserve's ready slabs.
  uint64_t slab_size = uint64_t{64} << 20;
  // Ready (pre-touched, zeroed) slabs a background thread keeps, while the budget allows.
  int reserve_slabs = 2;
  HugePagesMode hugepages = HugePagesMode::kAuto;
  // Threads that pre-touch each ready slab; 0 = one per CPU.
  int pretouch_threads = 0;
  // mlock the pool so it is never swapped out (needs CAP_IPC_LOCK or a large RLIMIT_MEMLOCK).
  bool mlock = false;
};

struct LimitsConfig {
  int max_sessions = 256;
  int max_requests_per_session = 4096;
  // fd-channel connections one peer uid may hold open at once (a session's client holds one).
  int max_fd_connections_per_peer = 1024;
  // Descriptors sent over the fd channel and not yet read by their peer (in flight): at most this
  // many on one connection, and this many over all connections of one peer uid. The kernel counts
  // every descriptor in flight against the daemon's RLIMIT_NOFILE, and past it refuses to pass any
  // more, to anyone: these bounds answer first, and only the tenant that does not read.
  int max_fds_in_flight_per_connection = 4;
  int max_fds_in_flight_per_peer = 64;
  // Control-socket (gRPC) connections one peer uid may hold open at once; admins have no cap.
  int max_control_connections_per_peer = 1024;
  // Serve control lanes (a session's lifecycle calls on a connection of its own to the fd socket,
  // hisparse/common/control_lane.h); off, sessions' clients keep gRPC.
  bool control_lanes = true;
  // Session streams one peer uid may hold before their first message (`open`) arrives; admins
  // have no cap. Every Session stream, opening or open, also takes one of max_sessions.
  int max_opening_sessions_per_peer = 16;
  // How long a Session stream may wait for its `open` before the daemon cancels it.
  int session_open_timeout_ms = 5000;
  // Node-wide bytes of host slot arenas (memfd arenas of sessions on the host backend or with
  // gpu = -1) all sessions together may hold: an arena's pages become real memory as its engine
  // touches them. 0 = auto: what the machine (MemAvailable, capped by the cgroup limit) has left
  // at start once the host pool is taken.
  uint64_t host_arena_bytes = 0;
  // The longest context one request may hold: sizes every session's page-table stride.
  int max_tokens_per_request = 1 << 20;
};

// Who may attach. The sockets are created with mode 0660; with `socket_group` set they belong to
// that group, so membership is the first gate. Every connection's peer is then read with
// SO_PEERCRED and refused unless its uid or gid is listed (empty lists admit any peer that could
// open the socket). Admins (root, the daemon's own uid, and `admin_uids` / `admin_gids`) are
// always admitted, see every tenant's sessions and may evict any request or drain the node; any
// other peer sees and acts on its own sessions only.
struct AccessConfig {
  std::string socket_group;  // group name or numeric gid; "" keeps the daemon's group
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  std::vector<uint32_t> admin_uids;
  std::vector<uint32_t> admin_gids;
};

// Hard per-tenant limits; a tenant is the uid of the engine process (read with SO_PEERCRED).
// 0 = unlimited.
struct QuotaConfig {
  uint64_t host_bytes = 0;   // host pool bytes one tenant may hold
  uint64_t arena_bytes = 0;  // slot-arena bytes one tenant may hold, summed over GPUs
  int requests = 0;          // admitted requests one tenant may hold
  int sessions = 0;          // sessions one tenant may hold open
  int pages = 0;             // host pool pages one tenant may hold (host_bytes counts them too)
};

enum class OnPoolFull { kReject, kEvictLruIdle };
std::string_view OnPoolFullName(OnPoolFull mode);

struct AdmissionConfig {
  // What a full pool does to an Admit: reject (RESOURCE_EXHAUSTED), or evict the same tenant's
  // least recently admitted request (its session is told on its stream first) and retry.
  OnPoolFull on_pool_full = OnPoolFull::kReject;
};

// Imports from a prefill node over UCX (AdmitRequest.begin_import; docs/DESIGN.md, "Import").
struct ImportConfig {
  // Serve imports (when the daemon was built with UCX; without it imports are always off, and the
  // daemon says so once at start). Writes arrive as active messages that the import worker (a
  // process of its own) checks against their grant and copies; no memory is open to remote writes
  // (DESIGN.md, "Import").
  bool enabled = true;
  // Seconds an import grant stays open; an expired grant frees its request.
  int grant_ttl = 30;
  // UCX_TLS for the daemon's UCX context; "" keeps UCX's choice (or the environment's UCX_TLS).
  // shm serves writers of the daemon's uid, tcp every other (UCX's shm refuses another uid).
  std::string ucx_tls = "shm,tcp";
  // UCX_NET_DEVICES: where the worker's tcp (or RDMA) transport listens; "lo" keeps it on this
  // node. "" keeps UCX's choice (every interface): for imports from other nodes.
  std::string ucx_net_devices = "lo";
  // The import worker's RLIMIT_DATA (0: none): bounds what UCX buffers for writers.
  uint64_t worker_memory = uint64_t{2} << 30;
};

// Durable requests (SetLease, AdmitRequest.lease_seconds; docs/DESIGN.md, "Durable requests").
struct DurabilityConfig {
  // The longest lease a request may hold, in seconds: what a tenant can keep pinned after its
  // engine died. 0 turns durable requests off.
  int max_lease_seconds = 3600;
  // Ended sessions one tenant may have kept for their durable requests (orphans) at once; a
  // session that ends beyond it releases its durable requests. 0 = no limit.
  int max_orphans_per_tenant = 64;
  // Durable requests outlive the daemon's own restarts where a service manager keeps its fds
  // (request_journal.h). Restart-only.
  bool keep_across_restarts = true;
};

struct MetricsConfig {
  // Prometheus exposition (HTTP, /metrics): "HOST:PORT", loopback by default; "" turns it off.
  std::string listen = "127.0.0.1:9464";
};

struct DaemonConfig {
  // gRPC listen address: "unix:PATH" (relative or absolute) or "unix:///ABSOLUTE/PATH".
  std::string listen = "unix:/run/hisparse/hisparsed.sock";
  HostPoolConfig host_pool;
  DeviceKind device = DeviceKind::kAuto;
  // Per GPU bytes the daemon may take for slot arenas; 0 = no limit.
  uint64_t gpu_memory_budget = 0;
  struct GpuConfig {
    ArenaExportMode arena_export = ArenaExportMode::kAuto;
  } gpu;
  LimitsConfig limits;
  AccessConfig access;
  QuotaConfig quotas;
  AdmissionConfig admission;
  MetricsConfig metrics;
  ImportConfig import;
  DurabilityConfig durability;
  LogLevel log_level = LogLevel::kInfo;
  LogFormatKind log_format = LogFormatKind::kText;
  LogPrefixMode log_priority_prefix = LogPrefixMode::kAuto;
};

bool operator==(const DaemonConfig& a, const DaemonConfig& b);
inline bool operator!=(const DaemonConfig& a, const DaemonConfig& b) { return !(a == b); }

// One documented key, for generated docs, --help and the example-file test.
struct ConfigKeyInfo {
  std::string key;            // dotted: "host_pool.size"
  std::string type;           // "byte size", "integer >= 1", "bool", "auto | on | off", ...
  std::string default_value;  // as written in YAML: "1GiB", "auto", "false"
  std::string help;           // one line
};

// Every key, in file order (sections grouped). Built once; the reference stays valid.
const std::vector<ConfigKeyInfo>& ConfigKeys();

// Parses a YAML document; keys not given keep their defaults (an empty document gives
// DaemonConfig{}, unless `allow_empty` is false: a reload refuses a file truncated or not yet
// written, which would silently drop every quota; `{}` still says "all defaults"). Refuses
// unknown keys at any level, keys given twice, a map or list where a value is expected and vice
// versa, bad values, and YAML syntax errors (with line and column). The result is validated
// (ValidateConfig).
absl::StatusOr<DaemonConfig> ParseConfigYaml(std::string_view yaml_text, bool allow_empty = true);

// Reads and parses `path`; every error message starts with the path.
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path, bool allow_empty = true);

// Sets one key from its text form, as a command-line flag gives it: ("host_pool.size", "64GiB").
// Checks that key's own constraints; on error `config` is unchanged. Constraints between keys
// are left to ValidateConfig, to be called after the last override.
absl::Status ApplyConfigOverride(DaemonConfig& config, std::string_view key, std::string_view value);

// Checks every key's constraints and those between keys (e.g. hugepages: on needs 2 MiB
// multiples). The first violation is returned, naming its key.
absl::Status ValidateConfig(const DaemonConfig& config);

// The config as YAML, each key with its help as a comment; ParseConfigYaml reads it back equal.
std::string RenderConfigYaml(const DaemonConfig& config);

// The dotted keys whose values differ between a and b, in table order (for SIGHUP reloads).
std::vector<std::string> DiffConfigKeys(const DaemonConfig& a, const DaemonConfig& b);
// The same keys as `key: "old" -> "new"`, for the log of a reload.
std::vector<std::string> DescribeConfigChanges(const DaemonConfig& a, const DaemonConfig& b);

// A key's value as RenderConfigYaml writes it (unquoted); empty for a key the table lacks.
std::string ConfigKeyValue(const DaemonConfig& config, std::string_view key);

// "unix:/run/x.sock" -> "/run/x.sock"; "unix:///run/x.sock" -> "/run/x.sock"; "unix:rel.sock" ->
// "rel.sock". Empty when `listen` is not a unix: address.
std::string_view ListenSocketPath(std::string_view listen);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_CONFIG_H_
