#include "hisparse/daemon/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "hisparse/common/size_parse.h"
#include "hisparse/common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace hisparse {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPageSize = 4096;
constexpr uint64_t kHugePageSize = 2 * kMiB;  // x86-64's default huge page
constexpr size_t kMaxUnixPathBytes = 107;     // sizeof(sockaddr_un::sun_path) - 1 for the NUL

// Debian's Abseil has its own string_view (ABSL_OPTION_USE_STD_STRING_VIEW is 0), which does not
// convert from std::string_view on its own.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// ---- value parsers: messages carry no key; the caller prefixes it ----

std::string Quote(std::string_view text) { return absl::StrCat("\"", absl::CHexEscape(ToAbsl(text)), "\""); }

absl::StatusOr<int> ParseInt(std::string_view text) {
  int value = 0;
  if (!absl::SimpleAtoi(ToAbsl(text), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse ", Quote(text), " as an integer"));
  }
  return value;
}

absl::StatusOr<bool> ParseBool(std::string_view text) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(ToAbsl(text)));
  if (v == "true" || v == "yes" || v == "on" || v == "1") return true;
  if (v == "false" || v == "no" || v == "off" || v == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat("cannot parse ", Quote(text), " as a bool (true or false)"));
}

template <typename Enum, size_t N>
absl::StatusOr<Enum> ParseEnum(std::string_view text, const char* const (&names)[N]) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(ToAbsl(text)));
  for (size_t i = 0; i < N; ++i) {
    if (v == names[i]) return static_cast<Enum>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is not one of ", absl::StrJoin(names, ", ")));
}

// "1000, 1001" -> {1000, 1001}; "" -> {}.
absl::StatusOr<std::vector<uint32_t>> ParseIdList(std::string_view text) {
  std::vector<uint32_t> ids;
  const std::string v(absl::StripAsciiWhitespace(ToAbsl(text)));
  if (v.empty() || v == "[]") return ids;
  for (absl::string_view part : absl::StrSplit(v, ',')) {
    uint32_t id = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot parse ", Quote(text), " as a comma-separated list of ids"));
    }
    ids.push_back(id);
  }
  return ids;
}

std::string RenderIdList(const std::vector<uint32_t>& ids) { return absl::StrJoin(ids, ","); }

// Indexed by the enums' values.
constexpr const char* kOnPoolFullNames[] = {"reject", "evict_lru_idle"};
constexpr const char* kHugePagesNames[] = {"auto", "on", "off"};
constexpr const char* kDeviceNames[] = {"auto", "cuda", "host"};
constexpr const char* kArenaExportNames[] = {"auto", "vmm", "cuda_ipc"};
constexpr const char* kLogLevelNames[] = {"debug", "info", "warning", "error"};
constexpr const char* kLogFormatNames[] = {"text", "json"};
constexpr const char* kLogPrefixNames[] = {"auto", "on", "off"};

absl::StatusOr<HugePagesMode> ParseHugePages(std::string_view text) {
  return ParseEnum<HugePagesMode>(text, kHugePagesNames);
}
absl::StatusOr<DeviceKind> ParseDevice(std::string_view text) { return ParseEnum<DeviceKind>(text, kDeviceNames); }
absl::StatusOr<ArenaExportMode> ParseArenaExport(std::string_view text) {
  return ParseEnum<ArenaExportMode>(text, kArenaExportNames);
}
absl::StatusOr<LogLevel> ParseLogLevel(std::string_view text) { return ParseEnum<LogLevel>(text, kLogLevelNames); }
absl::StatusOr<LogFormatKind> ParseLogFormat(std::string_view text) {
  return ParseEnum<LogFormatKind>(text, kLogFormatNames);
}
absl::StatusOr<LogPrefixMode> ParseLogPrefix(std::string_view text) {
  return ParseEnum<LogPrefixMode>(text, kLogPrefixNames);
}
absl::StatusOr<OnPoolFull> ParseOnPoolFull(std::string_view text) {
  return ParseEnum<OnPoolFull>(text, kOnPoolFullNames);
}

template <size_t N>
std::string_view NameOf(int index, const char* const (&names)[N]) {
  return index >= 0 && static_cast<size_t>(index) < N ? names[index] : "?";
}

// ---- per-key constraints ----

absl::Status CheckListen(std::string_view listen) {
  if (!StartsWith(listen, "unix:")) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(listen), " is not a unix socket address (write unix:PATH)"));
  }
  const std::string_view path = ListenSocketPath(listen);
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(Quote(listen), " has no socket path"));
  if (StartsWith(listen, "unix://") && path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(Quote(listen), ": after unix:// the path must be absolute (unix:///run/x.sock)"));
  }
  if (path.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(listen), " contains a NUL byte"));
  }
  if (path.size() > kMaxUnixPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path is ", path.size(), " bytes; unix sockets allow at most ", kMaxUnixPathBytes));
  }
  return absl::OkStatus();
}

// "must be a multiple of 4KiB, got 100000001 (95.4 MiB); 99999744 (97656KiB) or 100003840 (97660KiB)
// would do; sizes are ..." : the refusal names the nearest sizes that would do, and the rule.
absl::Status NotAMultiple(uint64_t bytes, uint64_t unit, const std::string& unit_name) {
  const uint64_t below = bytes / unit * unit;
  std::string nearest = below == 0 ? "" : absl::StrCat(below, " (", FormatByteSizeExact(below), ") or ");
  if (bytes <= UINT64_MAX - unit) {
    absl::StrAppend(&nearest, below + unit, " (", FormatByteSizeExact(below + unit), ") would do");
  } else {
    absl::StrAppend(&nearest, "would do");
  }
  return absl::InvalidArgumentError(absl::StrCat("must be a multiple of ", unit_name, ", got ", bytes, " (",
                                                 FormatByteSize(bytes), "); ", nearest, "; ", kByteSizeRule));
}

absl::Status CheckPoolBytes(uint64_t bytes) {
  if (bytes < kMiB) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be at least 1MiB, got ", bytes, " (a unit missing?); ", kByteSizeRule));
  }
  if (bytes % kPageSize != 0) return NotAMultiple(bytes, kPageSize, "4KiB");
  return absl::OkStatus();
}

absl::Status CheckAtLeast(int value, int min) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("must be >= ", min, ", got ", value));
}

// ---- the key table: the one place a key is defined ----

struct KeySpec {
  const char* key;
  const char* type;
  const char* help;
  bool quote;  // render double-quoted: strings, and on/off (YAML 1.1 readers take them for bools)
  absl::Status (*set)(DaemonConfig&, std::string_view);
  std::string (*get)(const DaemonConfig&);
  absl::Status (*check)(const DaemonConfig&);  // nullptr: every parsed value is valid
};

#define HS_SET_WITH(parser, field)                          \
  [](DaemonConfig& c, std::string_view v) -> absl::Status { \
    HS_ASSIGN_OR_RETURN(c.field, parser(v));                \
    return absl::OkStatus();                                \
  }

const std::vector<KeySpec>& Specs() {
  static const auto* specs = new std::vector<KeySpec>{
      {"listen", "unix:PATH", "gRPC control socket: unix:PATH (relative or absolute) or unix:///ABS/PATH.", true,
       [](DaemonConfig& c, std::string_view v) -> absl::Status {
         c.listen = std::string(v);
         return absl::OkStatus();
       },
       [](const DaemonConfig& c) { return c.listen; }, [](const DaemonConfig& c) { return CheckListen(c.listen); }},
      {"host_pool.size", "byte size",
       "Host KV pool budget: all sessions' pages, the reserve and slabs being made. At least 1MiB.", false,
       HS_SET_WITH(ParseByteSize, host_pool.size),
       [](const DaemonConfig& c) { return FormatByteSizeExact(c.host_pool.size); },
       [](const DaemonConfig& c) { return CheckPoolBytes(c.host_pool.size); }},
      {"host_pool.page_size", "byte size",
       "Pages handed to requests; a record never straddles one. A multiple of 4KiB (2MiB with huge pages on).", false,
       HS_SET_WITH(ParseByteSize, host_pool.page_size),
       [](const DaemonConfig& c) { return FormatByteSizeExact(c.host_pool.page_size); },
       [](const DaemonConfig& c) -> absl::Status {
         if (c.host_pool.page_size >= kPageSize && c.host_pool.page_size % kPageSize == 0) return absl::OkStatus();
         return NotAMultiple(c.host_pool.page_size, kPageSize, "4KiB");
       }},
      {"host_pool.slab_size", "byte size",
       "The largest slab (one memfd, one session's pages only) and the reserve's slab size; whole pages.", false,
       HS_SET_WITH(ParseByteSize, host_pool.slab_size),
       [](const DaemonConfig& c) { return FormatByteSizeExact(c.host_pool.slab_size); },
       [](const DaemonConfig& c) -> absl::Status {
         const uint64_t page = c.host_pool.page_size, slab = c.host_pool.slab_size;
         if (page != 0 && slab >= page && slab % page == 0 && slab / page <= UINT32_MAX) return absl::OkStatus();
         if (page == 0 || slab < page) {
           return absl::InvalidArgumentError(absl::StrCat("must be a whole number of pages (host_pool.page_size ",
                                                          FormatByteSizeExact(page), "), got ", slab, "; ",
                                                          kByteSizeRule));
         }
         return NotAMultiple(
             slab, page,
             absl::StrCat("host_pool.page_size (", FormatByteSizeExact(page), "): a whole number of pages"));
       }},
      {"host_pool.reserve_slabs", "integer >= 0",
       "Ready (pre-touched, zeroed) full slabs a background thread keeps while the budget allows.", false,
       HS_SET_WITH(ParseInt, host_pool.reserve_slabs),
       [](const DaemonConfig& c) { return absl::StrCat(c.host_pool.reserve_slabs); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.host_pool.reserve_slabs, 0); }},
      {"host_pool.hugepages", "auto | on | off",
       "MFD_HUGETLB pages: auto tries them and falls back quietly; on fails start-up without them.", true,
       HS_SET_WITH(ParseHugePages, host_pool.hugepages),
       [](const DaemonConfig& c) { return std::string(HugePagesModeName(c.host_pool.hugepages)); }, nullptr},
      {"host_pool.pretouch_threads", "integer >= 0", "Threads that pre-touch each ready slab; 0 = one per CPU.", false,
       HS_SET_WITH(ParseInt, host_pool.pretouch_threads),
       [](const DaemonConfig& c) { return absl::StrCat(c.host_pool.pretouch_threads); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.host_pool.pretouch_threads, 0); }},
      {"host_pool.mlock", "bool", "mlock the pool so it never swaps (needs CAP_IPC_LOCK or RLIMIT_MEMLOCK).", false,
       HS_SET_WITH(ParseBool, host_pool.mlock),
       [](const DaemonConfig& c) { return std::string(c.host_pool.mlock ? "true" : "false"); }, nullptr},
      {"device", "auto | cuda | host",
       "Where GPU sessions' slot arenas live: cuda (GPU memory; start fails without a GPU), host (host memory), or "
       "auto (cuda when the daemon sees a usable GPU, else host, saying why in the log).",
       false, HS_SET_WITH(ParseDevice, device),
       [](const DaemonConfig& c) { return std::string(DeviceKindName(c.device)); }, nullptr},
      {"gpu_memory_budget", "byte size", "Per-GPU bytes the daemon may use for slot arenas; 0 = no limit.", false,
       HS_SET_WITH(ParseByteSize, gpu_memory_budget),
       [](const DaemonConfig& c) { return FormatByteSizeExact(c.gpu_memory_budget); },
       [](const DaemonConfig& c) -> absl::Status {
         if (c.gpu_memory_budget == 0 || c.gpu_memory_budget >= kMiB) return absl::OkStatus();
         return absl::InvalidArgumentError(absl::StrCat("must be 0 (no limit) or at least 1MiB, got ",
                                                        c.gpu_memory_budget, " (a unit missing?); ", kByteSizeRule));
       }},
      {"gpu.arena_export", "auto | vmm | cuda_ipc",
       "How GPU slot arenas reach engines (device cuda or auto): vmm (CUDA VMM, POSIX fd), cuda_ipc (legacy cudaIpc "
       "handle), or auto (vmm where the GPU supports fd export, else cuda_ipc).",
       false, HS_SET_WITH(ParseArenaExport, gpu.arena_export),
       [](const DaemonConfig& c) { return std::string(ArenaExportModeName(c.gpu.arena_export)); }, nullptr},
      {"limits.max_sessions", "integer >= 1", "Most sessions (engine connections) open at once.", false,
       HS_SET_WITH(ParseInt, limits.max_sessions),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.max_sessions); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.max_sessions, 1); }},
      {"limits.max_requests_per_session", "integer >= 1", "Most admitted requests one session may hold.", false,
       HS_SET_WITH(ParseInt, limits.max_requests_per_session),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.max_requests_per_session); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.max_requests_per_session, 1); }},
      {"limits.max_fd_connections_per_peer", "integer >= 1",
       "Most fd-channel connections one peer uid may hold open at once (each session's client holds one).", false,
       HS_SET_WITH(ParseInt, limits.max_fd_connections_per_peer),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.max_fd_connections_per_peer); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.max_fd_connections_per_peer, 1); }},
      {"limits.max_fds_in_flight_per_connection", "integer >= 1",
       "Most descriptors the fd channel sends on one connection that its peer has not read yet; past it "
       "a fetch is answered ERR RESOURCE_EXHAUSTED.",
       false, HS_SET_WITH(ParseInt, limits.max_fds_in_flight_per_connection),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.max_fds_in_flight_per_connection); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.max_fds_in_flight_per_connection, 1); }},
      {"limits.max_fds_in_flight_per_peer", "integer >= 1",
       "Most descriptors sent over the fd channel to one peer uid, all its connections together, that it has not "
       "read yet.",
       false, HS_SET_WITH(ParseInt, limits.max_fds_in_flight_per_peer),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.max_fds_in_flight_per_peer); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.max_fds_in_flight_per_peer, 1); }},
      {"limits.max_control_connections_per_peer", "integer >= 1",
       "Most control-socket (gRPC) connections one peer uid may hold open at once; admins have no cap.", false,
       HS_SET_WITH(ParseInt, limits.max_control_connections_per_peer),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.max_control_connections_per_peer); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.max_control_connections_per_peer, 1); }},
      {"limits.control_lanes", "bool",
       "Serve control lanes: each session's admissions, releases, parks and resumes on a connection of its own to "
       "the fd socket instead of gRPC (docs/DESIGN.md, \"The control lane\"). Off, clients keep gRPC; lanes open "
       "already stay until their sessions end. Changes on reload.",
       false, HS_SET_WITH(ParseBool, limits.control_lanes),
       [](const DaemonConfig& c) { return std::string(c.limits.control_lanes ? "true" : "false"); }, nullptr},
      {"limits.max_opening_sessions_per_peer", "integer >= 1",
       "Most Session streams one peer uid may hold before their `open` arrives; admins have no cap.", false,
       HS_SET_WITH(ParseInt, limits.max_opening_sessions_per_peer),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.max_opening_sessions_per_peer); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.max_opening_sessions_per_peer, 1); }},
      {"limits.session_open_timeout_ms", "integer >= 1",
       "Milliseconds a Session stream may wait for its first message (`open`) before it is cancelled.", false,
       HS_SET_WITH(ParseInt, limits.session_open_timeout_ms),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.session_open_timeout_ms); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.session_open_timeout_ms, 1); }},
      {"limits.host_arena_bytes", "byte size",
       "Host slot-arena bytes all sessions together may hold; 0 = auto (memory left at start after the pool).", false,
       HS_SET_WITH(ParseByteSize, limits.host_arena_bytes),
       [](const DaemonConfig& c) { return FormatByteSizeExact(c.limits.host_arena_bytes); }, nullptr},
      {"limits.max_tokens_per_request", "integer >= 1",
       "The longest context one request may hold (it sizes each session's page-table stride).", false,
       HS_SET_WITH(ParseInt, limits.max_tokens_per_request),
       [](const DaemonConfig& c) { return absl::StrCat(c.limits.max_tokens_per_request); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.limits.max_tokens_per_request, 1); }},
      {"access.socket_group", "group name, gid, or empty",
       "Group that owns the sockets (mode 0660): membership gates who can connect at all.", true,
       [](DaemonConfig& c, std::string_view v) -> absl::Status {
         c.access.socket_group = std::string(v);
         return absl::OkStatus();
       },
       [](const DaemonConfig& c) { return c.access.socket_group; }, nullptr},
      {"access.allowed_uids", "comma-separated uids",
       "Peers (SO_PEERCRED) admitted by uid; empty with empty gids: any.", true,
       HS_SET_WITH(ParseIdList, access.allowed_uids),
       [](const DaemonConfig& c) { return RenderIdList(c.access.allowed_uids); }, nullptr},
      {"access.allowed_gids", "comma-separated gids", "Peers (SO_PEERCRED) admitted by primary gid.", true,
       HS_SET_WITH(ParseIdList, access.allowed_gids),
       [](const DaemonConfig& c) { return RenderIdList(c.access.allowed_gids); }, nullptr},
      {"access.admin_uids", "comma-separated uids",
       "Peers (SO_PEERCRED uid) with the admin role: every tenant's sessions, evict, drain. Root and the "
       "daemon's own uid always have it.",
       true, HS_SET_WITH(ParseIdList, access.admin_uids),
       [](const DaemonConfig& c) { return RenderIdList(c.access.admin_uids); }, nullptr},
      {"access.admin_gids", "comma-separated gids", "Peers with the admin role by primary gid.", true,
       HS_SET_WITH(ParseIdList, access.admin_gids),
       [](const DaemonConfig& c) { return RenderIdList(c.access.admin_gids); }, nullptr},
      {"quotas.host_bytes", "byte size", "Host pool bytes one tenant (engine uid) may hold; 0 = no limit.", false,
       HS_SET_WITH(ParseByteSize, quotas.host_bytes),
       [](const DaemonConfig& c) { return FormatByteSizeExact(c.quotas.host_bytes); }, nullptr},
      {"quotas.arena_bytes", "byte size", "Slot-arena bytes one tenant may hold, all GPUs; 0 = no limit.", false,
       HS_SET_WITH(ParseByteSize, quotas.arena_bytes),
       [](const DaemonConfig& c) { return FormatByteSizeExact(c.quotas.arena_bytes); }, nullptr},
      {"quotas.requests", "integer >= 0", "Admitted requests one tenant may hold; 0 = no limit.", false,
       HS_SET_WITH(ParseInt, quotas.requests), [](const DaemonConfig& c) { return absl::StrCat(c.quotas.requests); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.quotas.requests, 0); }},
      {"quotas.sessions", "integer >= 0", "Sessions one tenant may hold open; 0 = no limit.", false,
       HS_SET_WITH(ParseInt, quotas.sessions), [](const DaemonConfig& c) { return absl::StrCat(c.quotas.sessions); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.quotas.sessions, 0); }},
      {"quotas.pages", "integer >= 0",
       "Host pool pages one tenant may hold (quotas.host_bytes counts them in bytes too); 0 = no limit.", false,
       HS_SET_WITH(ParseInt, quotas.pages), [](const DaemonConfig& c) { return absl::StrCat(c.quotas.pages); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.quotas.pages, 0); }},
      {"admission.on_pool_full", "reject | evict_lru_idle",
       "A full pool rejects an Admit, or evicts the tenant's least recently admitted request (notified first).", false,
       HS_SET_WITH(ParseOnPoolFull, admission.on_pool_full),
       [](const DaemonConfig& c) { return std::string(OnPoolFullName(c.admission.on_pool_full)); }, nullptr},
      {"metrics.listen", "HOST:PORT or empty",
       "Prometheus /metrics over HTTP; loopback by default, empty turns it off; port 0 takes a free port "
       "(logged at start).",
       true,
       [](DaemonConfig& c, std::string_view v) -> absl::Status {
         c.metrics.listen = std::string(v);
         return absl::OkStatus();
       },
       [](const DaemonConfig& c) { return c.metrics.listen; },
       [](const DaemonConfig& c) -> absl::Status {
         const std::string& l = c.metrics.listen;
         const size_t colon = l.rfind(':');
         int port = 0;
         // An IPv6 host goes in brackets ("[::1]:9464"), as in a URL; "::1:9464" is ambiguous.
         if (colon != std::string::npos && l.find(':') < colon && l.front() != '[') {
           return absl::InvalidArgumentError(
               absl::StrCat("an IPv6 host goes in brackets, e.g. [::1]:9464 or [::]:9464, got \"", l, "\""));
         }
         if (l.empty() ||
             (colon != std::string::npos && colon > 0 &&
              absl::SimpleAtoi(absl::string_view(l).substr(colon + 1), &port) && port >= 0 && port < 65536)) {
           return absl::OkStatus();
         }
         return absl::InvalidArgumentError(
             absl::StrCat("must be HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464) or empty, got \"", l, "\""));
       }},
      {"import.enabled", "bool",
       "Serve imports from prefill nodes over UCX (AdmitRequest.begin_import): writes arrive as active messages that "
       "hisparse-import-worker, a process of its own beside hisparsed, checks against their grant before it copies "
       "them (docs/DESIGN.md, \"Import\"); always off when built without UCX.",
       false, HS_SET_WITH(ParseBool, import.enabled),
       [](const DaemonConfig& c) { return std::string(c.import.enabled ? "true" : "false"); }, nullptr},
      {"import.grant_ttl", "seconds (integer >= 1)",
       "How long an import grant stays open; an expired grant frees its request's pages and row.", false,
       HS_SET_WITH(ParseInt, import.grant_ttl), [](const DaemonConfig& c) { return absl::StrCat(c.import.grant_ttl); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.import.grant_ttl, 1); }},
      {"import.ucx_tls", "UCX_TLS value or empty",
       "Transports of the daemon's UCX context: shm serves writers of the daemon's uid, tcp any other (UCX's shm "
       "refuses another uid); e.g. \"rc,shm,tcp\" for RDMA from prefill nodes; empty keeps UCX's choice or the "
       "environment's UCX_TLS.",
       true,
       [](DaemonConfig& c, std::string_view v) -> absl::Status {
         c.import.ucx_tls = std::string(v);
         return absl::OkStatus();
       },
       [](const DaemonConfig& c) { return c.import.ucx_tls; }, nullptr},
      {"import.ucx_net_devices", "UCX_NET_DEVICES value or empty",
       "Network devices of the daemon's UCX worker: \"lo\" keeps its tcp listener on this node; empty keeps UCX's "
       "choice (every interface), for imports from other nodes.",
       true,
       [](DaemonConfig& c, std::string_view v) -> absl::Status {
         c.import.ucx_net_devices = std::string(v);
         return absl::OkStatus();
       },
       [](const DaemonConfig& c) { return c.import.ucx_net_devices; }, nullptr},
      {"import.worker_memory", "byte size (0: no limit)",
       "The import worker's limit on private memory (RLIMIT_DATA): what UCX may buffer for writers, whose partial "
       "messages a hostile writer could otherwise grow without bound. A worker that reaches it ends; its open grants "
       "are aborted and a new worker starts. Granted pages it maps are shared memory and do not count.",
       false, HS_SET_WITH(ParseByteSize, import.worker_memory),
       [](const DaemonConfig& c) { return FormatByteSizeExact(c.import.worker_memory); }, nullptr},
      {"durability.max_lease_seconds", "seconds (integer >= 0)",
       "The longest lease of a durable request (SetLease): how long its pages may outlive a dead engine; 0 turns "
       "durable requests off. Changes on reload (SIGHUP): later leases are bounded by it, granted ones keep their "
       "deadline.",
       false, HS_SET_WITH(ParseInt, durability.max_lease_seconds),
       [](const DaemonConfig& c) { return absl::StrCat(c.durability.max_lease_seconds); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.durability.max_lease_seconds, 0); }},
      {"durability.max_orphans_per_tenant", "integer >= 0",
       "Ended sessions one tenant may have kept for their durable requests (orphans) at once; a session of a "
       "tenant at the cap releases its durable requests when it ends. 0 = no limit. Changes on reload (SIGHUP): "
       "orphans already kept stay.",
       false, HS_SET_WITH(ParseInt, durability.max_orphans_per_tenant),
       [](const DaemonConfig& c) { return absl::StrCat(c.durability.max_orphans_per_tenant); },
       [](const DaemonConfig& c) { return CheckAtLeast(c.durability.max_orphans_per_tenant, 0); }},
      {"durability.keep_across_restarts", "bool",
       "Keep durable requests across hisparsed's own restarts (a crash, an upgrade): their slabs and a journal go "
       "to the service manager's fd store (systemd's, with NotifyAccess=main and FileDescriptorStoreMax=; or "
       "hisparse-keeper's) and a restarted daemon takes them back as adoptable orphans. Without a store "
       "($NOTIFY_SOCKET unset) it has no effect.",
       false, HS_SET_WITH(ParseBool, durability.keep_across_restarts),
       [](const DaemonConfig& c) { return std::string(c.durability.keep_across_restarts ? "true" : "false"); },
       nullptr},
      {"log_level", "debug | info | warning | error", "Least severe log level written.", false,
       HS_SET_WITH(ParseLogLevel, log_level),
       [](const DaemonConfig& c) { return std::string(LogLevelName(c.log_level)); }, nullptr},
      {"log_format", "text | json",
       "text: one line per message (time, level, program[pid], file:line, message); json: one object per line "
       "(time, level, program, pid, node from $NODE_NAME, source, message) for log collectors.",
       false, HS_SET_WITH(ParseLogFormat, log_format),
       [](const DaemonConfig& c) { return std::string(LogFormatKindName(c.log_format)); }, nullptr},
      {"log_priority_prefix", "auto | on | off",
       "Start each line with its syslog priority (<3> error, <4> warning, <6> info, <7> debug), which journald "
       "reads as the entry's priority; auto: when stderr is the journal ($JOURNAL_STREAM).",
       true, HS_SET_WITH(ParseLogPrefix, log_priority_prefix),
       [](const DaemonConfig& c) { return std::string(LogPrefixModeName(c.log_priority_prefix)); }, nullptr},
  };
  return *specs;
}

#undef HS_SET_WITH

const KeySpec* FindSpec(std::string_view key) {
  for (const KeySpec& spec : Specs()) {
    if (spec.key == key) return &spec;
  }
  return nullptr;
}

// The names one level below `section` ("" = top level), in table order: "size, segment_size, ...".
std::vector<std::string> ChildNames(std::string_view section) {
  std::vector<std::string> names;
  const std::string prefix = section.empty() ? "" : absl::StrCat(ToAbsl(section), ".");
  for (const KeySpec& spec : Specs()) {
    std::string_view key = spec.key;
    if (!StartsWith(key, prefix)) continue;
    key.remove_prefix(prefix.size());
    std::string name(key.substr(0, key.find('.')));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

bool IsSection(std::string_view key) { return !key.empty() && !ChildNames(key).empty() && FindSpec(key) == nullptr; }

absl::Status KeyError(std::string_view key, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(ToAbsl(key), ": ", status.message()));
}

absl::Status UnknownKey(std::string_view key, std::string_view section) {
  return absl::InvalidArgumentError(absl::StrCat(ToAbsl(key), ": unknown key (",
                                                 section.empty() ? "top-level keys" : ToAbsl(section), ": ",
                                                 absl::StrJoin(ChildNames(section), ", "), ")"));
}

// ---- YAML ----

std::string Where(const YAML::Mark& mark) {
  if (mark.is_null()) return "";
  return absl::StrCat(" (line ", mark.line + 1, ", column ", mark.column + 1, ")");
}

const char* KindOf(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "no value";
  return "a value";
}

absl::Status WalkMap(const YAML::Node& map, const std::string& section, DaemonConfig& config,
                     std::set<std::string>& seen) {
  for (const auto& entry : map) {
    const YAML::Node& key_node = entry.first;
    const YAML::Node& value = entry.second;
    if (!key_node.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(section.empty() ? "(top level)" : section,
                                                     ": a key must be a plain name", Where(key_node.Mark())));
    }
    const std::string& name = key_node.Scalar();
    const std::string key = section.empty() ? name : absl::StrCat(section, ".", name);
    if (name.empty() || absl::StrContains(name, '.')) {
      // Dotted keys are for flags; in YAML each level is a map, so a key has one spelling.
      const absl::Status unknown = UnknownKey(key, section);
      return absl::Status(unknown.code(),
                          absl::StrCat(unknown.message(), "; write sections as nested maps", Where(key_node.Mark())));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": given twice", Where(key_node.Mark())));
    }
    if (const KeySpec* spec = FindSpec(key)) {
      if (!value.IsScalar()) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, ": expected ", spec->type, ", got ", KindOf(value), Where(key_node.Mark())));
      }
      const absl::Status status = spec->set(config, value.Scalar());
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat(key, ": ", status.message(), Where(value.Mark())));
      }
    } else if (IsSection(key)) {
      if (value.IsNull()) continue;  // "host_pool:" with nothing under it: all defaults
      if (!value.IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat(key, ": expected a map of ",
                                                       absl::StrJoin(ChildNames(key), ", "), ", got ", KindOf(value),
                                                       Where(key_node.Mark())));
      }
      HS_RETURN_IF_ERROR(WalkMap(value, key, config, seen));
    } else {
      const absl::Status unknown = UnknownKey(key, section);
      return absl::Status(unknown.code(), absl::StrCat(unknown.message(), Where(key_node.Mark())));
    }
  }
  return absl::OkStatus();
}

// A YAML double-quoted scalar.
std::string YamlQuote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned>(u), absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace

std::string_view HugePagesModeName(HugePagesMode mode) { return NameOf(static_cast<int>(mode), kHugePagesNames); }
std::string_view DeviceKindName(DeviceKind kind) { return NameOf(static_cast<int>(kind), kDeviceNames); }
std::string_view ArenaExportModeName(ArenaExportMode mode) { return NameOf(static_cast<int>(mode), kArenaExportNames); }
std::string_view OnPoolFullName(OnPoolFull mode) { return NameOf(static_cast<int>(mode), kOnPoolFullNames); }
std::string_view LogLevelName(LogLevel level) { return NameOf(static_cast<int>(level), kLogLevelNames); }
std::string_view LogFormatKindName(LogFormatKind format) { return NameOf(static_cast<int>(format), kLogFormatNames); }
std::string_view LogPrefixModeName(LogPrefixMode mode) { return NameOf(static_cast<int>(mode), kLogPrefixNames); }

bool operator==(const DaemonConfig& a, const DaemonConfig& b) {
  // Every key is rendered by the table, so comparing the rendered values covers every field
  // without a second list to keep in sync.
  for (const KeySpec& spec : Specs()) {
    if (spec.get(a) != spec.get(b)) return false;
  }
  return true;
}

std::vector<std::string> DiffConfigKeys(const DaemonConfig& a, const DaemonConfig& b) {
  std::vector<std::string> keys;
  for (const KeySpec& spec : Specs()) {
    if (spec.get(a) != spec.get(b)) keys.emplace_back(spec.key);
  }
  return keys;
}

const std::vector<ConfigKeyInfo>& ConfigKeys() {
  static const auto* keys = [] {
    auto* out = new std::vector<ConfigKeyInfo>;
    const DaemonConfig defaults;
    for (const KeySpec& spec : Specs()) out->push_back({spec.key, spec.type, spec.get(defaults), spec.help});
    return out;
  }();
  return *keys;
}

std::vector<std::string> DescribeConfigChanges(const DaemonConfig& a, const DaemonConfig& b) {
  std::vector<std::string> changes;
  for (const KeySpec& spec : Specs()) {
    const std::string before = spec.get(a), after = spec.get(b);
    if (before != after) changes.push_back(absl::StrCat(spec.key, ": ", Quote(before), " -> ", Quote(after)));
  }
  return changes;
}

std::string ConfigKeyValue(const DaemonConfig& config, std::string_view key) {
  const KeySpec* spec = FindSpec(key);
  return spec == nullptr ? std::string() : spec->get(config);
}

absl::StatusOr<DaemonConfig> ParseConfigYaml(std::string_view yaml_text, bool allow_empty) {
  DaemonConfig config;
  try {
    const YAML::Node root = YAML::Load(std::string(yaml_text));
    if (root.IsMap()) {
      std::set<std::string> seen;
      HS_RETURN_IF_ERROR(WalkMap(root, "", config, seen));
    } else if (root.IsNull() && !allow_empty) {
      return absl::InvalidArgumentError(
          "the config is empty: it would reset every key to its default (write `{}` to mean that)");
    } else if (!root.IsNull()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the config must be a map of keys at the top level, got ", KindOf(root), Where(root.Mark())));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("YAML syntax error", Where(e.mark), ": ", e.msg));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reading the config YAML: ", e.what()));
  } catch (...) {
    return absl::InternalError("reading the config YAML: unknown exception");
  }
  HS_RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path, bool allow_empty) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open config file ", path));
  std::string text;
  char buffer[8192];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  const int read_error = std::ferror(file) ? errno : 0;
  std::fclose(file);
  if (read_error != 0) return absl::ErrnoToStatus(read_error, absl::StrCat("cannot read config file ", path));
  absl::StatusOr<DaemonConfig> config = ParseConfigYaml(text, allow_empty);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::Status ApplyConfigOverride(DaemonConfig& config, std::string_view key, std::string_view value) {
  const KeySpec* spec = FindSpec(key);
  if (spec == nullptr) {
    if (IsSection(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(ToAbsl(key), ": is a section; set one of its keys: ", absl::StrJoin(ChildNames(key), ", ")));
    }
    const size_t dot = key.rfind('.');
    const std::string_view section = dot == std::string_view::npos ? "" : key.substr(0, dot);
    return UnknownKey(key, IsSection(section) ? section : "");
  }
  DaemonConfig updated = config;
  absl::Status status = spec->set(updated, value);
  if (status.ok() && spec->check != nullptr) status = spec->check(updated);
  if (!status.ok()) return KeyError(key, status);
  config = std::move(updated);
  return absl::OkStatus();
}

absl::Status ValidateConfig(const DaemonConfig& config) {
  for (const KeySpec& spec : Specs()) {
    if (spec.check == nullptr) continue;
    const absl::Status status = spec.check(config);
    if (!status.ok()) return KeyError(spec.key, status);
  }
  const HostPoolConfig& pool = config.host_pool;
  if (pool.hugepages == HugePagesMode::kOn) {
    for (const auto& [key, bytes] :
         {std::pair<const char*, uint64_t>{"host_pool.size", pool.size}, {"host_pool.page_size", pool.page_size}}) {
      if (bytes % kHugePageSize != 0) {
        const absl::Status why = NotAMultiple(bytes, kHugePageSize, "2MiB when host_pool.hugepages is on");
        return absl::InvalidArgumentError(absl::StrCat(key, ": ", why.message()));
      }
    }
  }
  return absl::OkStatus();
}

std::string RenderConfigYaml(const DaemonConfig& config) {
  std::string out = "# hisparsed configuration. Every key, with its help; deploy/hisparsed.yaml explains more.\n";
  std::string section;
  for (const KeySpec& spec : Specs()) {
    const std::string_view key = spec.key;
    const size_t dot = key.rfind('.');
    const std::string key_section(dot == std::string_view::npos ? "" : key.substr(0, dot));
    const std::string_view name = dot == std::string_view::npos ? key : key.substr(dot + 1);
    // The table groups keys by section, with one level of nesting: all this config has.
    if (key_section != section || section.empty()) out += "\n";
    if (key_section != section) {
      section = key_section;
      if (!section.empty()) absl::StrAppend(&out, section, ":\n");
    }
    const std::string_view indent = section.empty() ? "" : "  ";
    const std::string value = spec.get(config);
    absl::StrAppend(&out, ToAbsl(indent), "# ", spec.help, "\n", ToAbsl(indent), ToAbsl(name), ": ",
                    spec.quote ? YamlQuote(value) : value, "\n");
  }
  return out;
}

std::string_view ListenSocketPath(std::string_view listen) {
  if (StartsWith(listen, "unix://")) return listen.substr(7);
  if (StartsWith(listen, "unix:")) return listen.substr(5);
  return {};
}

}  // namespace hisparse
