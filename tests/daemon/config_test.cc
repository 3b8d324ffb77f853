#include "hisparse/daemon/config.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/common/size_parse.h"
#include "yaml-cpp/yaml.h"

namespace hisparse {
namespace config_test {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kGiB = uint64_t{1} << 30;

DaemonConfig MustParse(const std::string& yaml) {
  absl::StatusOr<DaemonConfig> c = ParseConfigYaml(yaml);
  EXPECT_TRUE(c.ok()) << c.status() << "\n" << yaml;
  return c.value_or(DaemonConfig{});
}

// The error for `yaml`, which must be InvalidArgument.
std::string ErrorOf(const std::string& yaml) {
  absl::StatusOr<DaemonConfig> c = ParseConfigYaml(yaml);
  EXPECT_FALSE(c.ok()) << "accepted:\n" << yaml;
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

TEST(ConfigTest, Defaults) {
  const DaemonConfig c;
  EXPECT_EQ(c.listen, "unix:/run/hisparse/hisparsed.sock");
  EXPECT_EQ(c.host_pool.size, kGiB);
  EXPECT_EQ(c.host_pool.page_size, 256 * kKiB);
  EXPECT_EQ(c.host_pool.slab_size, 64 * kMiB);
  EXPECT_EQ(c.host_pool.reserve_slabs, 2);
  EXPECT_EQ(c.limits.max_tokens_per_request, 1 << 20);
  EXPECT_EQ(c.host_pool.hugepages, HugePagesMode::kAuto);
  EXPECT_EQ(c.host_pool.pretouch_threads, 0);
  EXPECT_FALSE(c.host_pool.mlock);
  EXPECT_EQ(c.device, DeviceKind::kAuto);
  EXPECT_EQ(c.gpu_memory_budget, 0u);
  EXPECT_EQ(c.gpu.arena_export, ArenaExportMode::kAuto);
  EXPECT_EQ(c.limits.max_sessions, 256);
  EXPECT_EQ(c.limits.max_requests_per_session, 4096);
  EXPECT_EQ(c.log_level, LogLevel::kInfo);
  EXPECT_TRUE(ValidateConfig(c).ok());
}

TEST(ConfigTest, EmptyDocumentsGiveDefaults) {
  for (const char* yaml : {"", "\n", "# only a comment\n", "---\n", "~\n", "host_pool:\n"}) {
    EXPECT_EQ(MustParse(yaml), DaemonConfig{}) << yaml;
  }
}

TEST(ConfigTest, EveryKeyParsed) {
  const DaemonConfig c = MustParse(R"(
listen: unix:///tmp/h.sock
host_pool:
  size: 64GiB
  page_size: 4MiB
  slab_size: 512 MiB
  reserve_slabs: 3
  hugepages: on
  pretouch_threads: 8
  mlock: true
device: cuda
gpu_memory_budget: 40GiB
limits:
  max_sessions: 3
  max_requests_per_session: 17
log_level: debug
)");
  EXPECT_EQ(c.listen, "unix:///tmp/h.sock");
  EXPECT_EQ(c.host_pool.size, 64 * kGiB);
  EXPECT_EQ(c.host_pool.page_size, 4 * kMiB);
  EXPECT_EQ(c.host_pool.slab_size, 512 * kMiB);
  EXPECT_EQ(c.host_pool.reserve_slabs, 3);
  EXPECT_EQ(c.host_pool.hugepages, HugePagesMode::kOn);
  EXPECT_EQ(c.host_pool.pretouch_threads, 8);
  EXPECT_TRUE(c.host_pool.mlock);
  EXPECT_EQ(c.device, DeviceKind::kCuda);
  EXPECT_EQ(c.gpu_memory_budget, 40 * kGiB);
  EXPECT_EQ(c.limits.max_sessions, 3);
  EXPECT_EQ(c.limits.max_requests_per_session, 17);
  EXPECT_EQ(c.log_level, LogLevel::kDebug);
}

TEST(ConfigTest, EnumAndBoolSpellings) {
  EXPECT_EQ(MustParse("host_pool: {hugepages: \"off\"}").host_pool.hugepages, HugePagesMode::kOff);
  EXPECT_EQ(MustParse("host_pool: {hugepages: AUTO}").host_pool.hugepages, HugePagesMode::kAuto);
  EXPECT_EQ(MustParse("device: host").device, DeviceKind::kHost);
  EXPECT_EQ(MustParse("log_level: warning").log_level, LogLevel::kWarning);
  EXPECT_EQ(MustParse("log_level: error").log_level, LogLevel::kError);
  EXPECT_EQ(MustParse("log_format: json").log_format, LogFormatKind::kJson);
  EXPECT_EQ(MustParse("log_priority_prefix: \"off\"").log_priority_prefix, LogPrefixMode::kOff);
  EXPECT_TRUE(MustParse("host_pool: {mlock: yes}").host_pool.mlock);
  EXPECT_FALSE(MustParse("host_pool: {mlock: False}").host_pool.mlock);
  EXPECT_EQ(MustParse("listen: unix:rel/h.sock").listen, "unix:rel/h.sock");
}

struct BadValue {
  std::string yaml;
  const char* key;  // the message must start with "<key>: "
  const char* why;  // and contain this
};

TEST(ConfigTest, EveryBadValueNamesItsKey) {
  const std::vector<BadValue> cases = {
      {"listen: tcp:0.0.0.0:5000", "listen", "not a unix socket address"},
      {"listen: \"unix:\"", "listen", "no socket path"},
      {"listen: \"unix://\"", "listen", "no socket path"},
      {"listen: unix://rel.sock", "listen", "must be absolute"},
      {"listen: unix:/" + std::string(120, 'x'), "listen", "at most 107"},
      {"host_pool: {size: 12XB}", "host_pool.size", "cannot parse \"12XB\" as a byte size: unknown unit \"XB\""},
      {"host_pool: {size: -1GiB}", "host_pool.size", "negative"},
      {"host_pool: {size: 99999999999PiB}", "host_pool.size", "64 bits"},
      {"host_pool: {size: 4096}", "host_pool.size", "at least 1MiB"},
      {"host_pool: {size: 1000KiB}", "host_pool.size", "at least 1MiB"},
      {"host_pool: {size: 8GB}", "host_pool.size", "write 8GiB for 8 GiB, or 8000000000"},
      {"host_pool: {size: 100000001}", "host_pool.size",
       "multiple of 4KiB, got 100000001 (95.4 MiB); 99999744 (97656KiB) or 100003840 (97660KiB) would do; sizes"},
      {"host_pool: {page_size: 512}", "host_pool.page_size", "multiple of 4KiB"},
      {"host_pool: {page_size: 2000001}", "host_pool.page_size", "multiple of 4KiB"},
      {"host_pool: {slab_size: 3000KiB}", "host_pool.slab_size", "whole number of pages"},
      {"host_pool: {page_size: 4MiB, slab_size: 2MiB}", "host_pool.slab_size", "whole number of pages"},
      {"host_pool: {reserve_slabs: -1}", "host_pool.reserve_slabs", "must be >= 0"},
      {"limits: {max_tokens_per_request: 0}", "limits.max_tokens_per_request", "must be >= 1"},
      {"quotas: {pages: -1}", "quotas.pages", "must be >= 0"},
      {"host_pool: {hugepages: maybe}", "host_pool.hugepages", "\"maybe\" is not one of auto, on, off"},
      {"host_pool: {pretouch_threads: -1}", "host_pool.pretouch_threads", "must be >= 0, got -1"},
      {"host_pool: {pretouch_threads: four}", "host_pool.pretouch_threads", "as an integer"},
      {"host_pool: {pretouch_threads: 1.5}", "host_pool.pretouch_threads", "as an integer"},
      {"host_pool: {pretouch_threads: 99999999999}", "host_pool.pretouch_threads", "as an integer"},
      {"host_pool: {mlock: maybe}", "host_pool.mlock", "as a bool"},
      {"device: tpu", "device", "\"tpu\" is not one of auto, cuda, host"},
      {"gpu_memory_budget: lots", "gpu_memory_budget", "as a byte size"},
      {"gpu_memory_budget: 40", "gpu_memory_budget", "a unit missing?"},
      {"limits: {max_sessions: 0}", "limits.max_sessions", "must be >= 1, got 0"},
      {"limits: {max_requests_per_session: -5}", "limits.max_requests_per_session", "must be >= 1"},
      {"log_level: verbose", "log_level", "is not one of debug, info, warning, error"},
      // Cross-key constraints.
      {"host_pool: {hugepages: on, size: 1025MiB}", "host_pool.size", "multiple of 2MiB"},
      {"host_pool: {hugepages: on, page_size: 1MiB}", "host_pool.page_size", "multiple of 2MiB"},
  };
  for (const BadValue& bad : cases) {
    const std::string msg = ErrorOf(bad.yaml);
    EXPECT_THAT(msg, StartsWith(std::string(bad.key) + ": ")) << bad.yaml;
    EXPECT_THAT(msg, HasSubstr(bad.why)) << bad.yaml;
  }
}

TEST(ConfigTest, BadValueMessageHasTheSpecifiedFormAndLine) {
  EXPECT_EQ(ErrorOf("host_pool:\n  size: 12XB\n"),
            std::string("host_pool.size: cannot parse \"12XB\" as a byte size: unknown unit \"XB\" (") + kByteSizeRule +
                ") (line 2, column 9)");
}

TEST(ConfigTest, WrongYamlTypes) {
  EXPECT_THAT(ErrorOf("host_pool:\n  size: {a: 1}\n"), StartsWith("host_pool.size: expected byte size, got a map"));
  EXPECT_THAT(ErrorOf("host_pool:\n  size: [1, 2]\n"), StartsWith("host_pool.size: expected byte size, got a list"));
  EXPECT_THAT(ErrorOf("log_level:\n"), StartsWith("log_level: expected debug | info | warning | error, got no value"));
  EXPECT_THAT(ErrorOf("host_pool: 4GiB\n"), StartsWith("host_pool: expected a map of size, page_size, slab_size"));
  EXPECT_THAT(ErrorOf("limits: [1]\n"), StartsWith("limits: expected a map of max_sessions"));
  EXPECT_THAT(ErrorOf("- listen\n- device\n"), HasSubstr("must be a map of keys at the top level, got a list"));
  EXPECT_THAT(ErrorOf("just a string\n"), HasSubstr("got a value"));
  EXPECT_THAT(ErrorOf("? [a, b]\n: 1\n"), HasSubstr("a key must be a plain name"));
}

TEST(ConfigTest, UnknownKeysAtEveryLevel) {
  EXPECT_THAT(ErrorOf("lisen: unix:/x\n"), StartsWith("lisen: unknown key (top-level keys: listen, host_pool,"));
  EXPECT_THAT(ErrorOf("host_pool:\n  sise: 1GiB\n"),
              StartsWith("host_pool.sise: unknown key (host_pool: size, page_size, slab_size, reserve_slabs, "
                         "hugepages, pretouch_threads, mlock)"));
  EXPECT_THAT(ErrorOf("limits:\n  max_session: 3\n"), StartsWith("limits.max_session: unknown key"));
  EXPECT_THAT(ErrorOf("host_pool:\n  size:\n    extra: 1\n"), StartsWith("host_pool.size: expected"));
  // Dotted keys are the flag spelling, not YAML's.
  EXPECT_THAT(ErrorOf("host_pool.size: 2GiB\n"), StartsWith("host_pool.size: unknown key"));
  EXPECT_THAT(ErrorOf("host_pool.size: 2GiB\n"), HasSubstr("nested maps"));
  EXPECT_THAT(ErrorOf("host_pool:\n  size: 2GiB\n  size: 3GiB\n"), StartsWith("host_pool.size: given twice"));
}

TEST(ConfigTest, YamlSyntaxErrorHasLineAndColumn) {
  const std::string msg = ErrorOf("host_pool:\n  size: 1GiB\n   bad: [unclosed\n");
  EXPECT_THAT(msg, StartsWith("YAML syntax error (line "));
  EXPECT_THAT(msg, HasSubstr("column"));
  EXPECT_THAT(ErrorOf("host_pool: {size: 1GiB\n"), StartsWith("YAML syntax error"));
  EXPECT_THAT(ErrorOf("a: b: c\n"), StartsWith("YAML syntax error (line 1"));
}

TEST(ConfigTest, GpuArenaExport) {
  EXPECT_EQ(MustParse("gpu: {arena_export: vmm}").gpu.arena_export, ArenaExportMode::kVmm);
  EXPECT_EQ(MustParse("gpu: {arena_export: CUDA_IPC}").gpu.arena_export, ArenaExportMode::kCudaIpc);
  EXPECT_EQ(MustParse("gpu: {arena_export: auto}").gpu.arena_export, ArenaExportMode::kAuto);
  DaemonConfig c;
  ASSERT_TRUE(ApplyConfigOverride(c, "gpu.arena_export", "cuda_ipc").ok());
  EXPECT_EQ(c.gpu.arena_export, ArenaExportMode::kCudaIpc);
  EXPECT_EQ(ArenaExportModeName(c.gpu.arena_export), "cuda_ipc");
  const absl::Status bad = ApplyConfigOverride(c, "gpu.arena_export", "ipc");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("gpu.arena_export"));
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("auto, vmm, cuda_ipc"));
  EXPECT_EQ(c.gpu.arena_export, ArenaExportMode::kCudaIpc);  // unchanged by the bad value
  DaemonConfig d;
  ASSERT_TRUE(ApplyConfigOverride(d, "gpu.arena_export", "cuda_ipc").ok());
  EXPECT_NE(d, DaemonConfig{});  // equality covers the new key
}

TEST(ConfigTest, Overrides) {
  DaemonConfig c;
  ASSERT_TRUE(ApplyConfigOverride(c, "host_pool.size", "64GiB").ok());
  ASSERT_TRUE(ApplyConfigOverride(c, "listen", "unix:/tmp/x.sock").ok());
  ASSERT_TRUE(ApplyConfigOverride(c, "limits.max_sessions", "9").ok());
  ASSERT_TRUE(ApplyConfigOverride(c, "host_pool.mlock", "true").ok());
  ASSERT_TRUE(ApplyConfigOverride(c, "device", "host").ok());
  EXPECT_EQ(c.host_pool.size, 64 * kGiB);
  EXPECT_EQ(c.listen, "unix:/tmp/x.sock");
  EXPECT_EQ(c.limits.max_sessions, 9);
  EXPECT_TRUE(c.host_pool.mlock);
  EXPECT_EQ(c.device, DeviceKind::kHost);
  EXPECT_TRUE(ValidateConfig(c).ok());
}

TEST(ConfigTest, BadOverridesNameTheKeyAndChangeNothing) {
  DaemonConfig c;
  const DaemonConfig before = c;
  absl::Status s = ApplyConfigOverride(c, "host_pool.size", "12XB");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("host_pool.size: cannot parse \"12XB\" as a byte size: unknown unit \"XB\""));
  // Parses, but breaks the key's own constraint: refused too.
  EXPECT_THAT(std::string(ApplyConfigOverride(c, "limits.max_sessions", "0").message()),
              StartsWith("limits.max_sessions: must be >= 1"));
  EXPECT_THAT(std::string(ApplyConfigOverride(c, "listen", "tcp:1").message()), StartsWith("listen: "));
  EXPECT_THAT(std::string(ApplyConfigOverride(c, "host_pool.sise", "1").message()),
              StartsWith("host_pool.sise: unknown key (host_pool: size,"));
  EXPECT_THAT(std::string(ApplyConfigOverride(c, "nope", "1").message()),
              StartsWith("nope: unknown key (top-level keys:"));
  EXPECT_THAT(std::string(ApplyConfigOverride(c, "host_pool", "1").message()), StartsWith("host_pool: is a section"));
  EXPECT_EQ(c, before);
}

TEST(ConfigTest, CrossKeyConstraintsWaitForValidate) {
  DaemonConfig c;
  ASSERT_TRUE(ApplyConfigOverride(c, "host_pool.page_size", "1MiB").ok());
  ASSERT_TRUE(ApplyConfigOverride(c, "host_pool.hugepages", "on").ok());
  EXPECT_THAT(std::string(ValidateConfig(c).message()), StartsWith("host_pool.page_size: must be a multiple of 2MiB"));
  ASSERT_TRUE(ApplyConfigOverride(c, "host_pool.page_size", "4MiB").ok());
  EXPECT_TRUE(ValidateConfig(c).ok());
}

TEST(ConfigTest, ValidateCatchesProgrammaticValues) {
  DaemonConfig c;
  c.host_pool.pretouch_threads = -2;
  EXPECT_THAT(std::string(ValidateConfig(c).message()), StartsWith("host_pool.pretouch_threads: "));
  c = DaemonConfig{};
  c.listen = "unix:";
  EXPECT_THAT(std::string(ValidateConfig(c).message()), StartsWith("listen: "));
}

TEST(ConfigTest, RenderRoundTrips) {
  EXPECT_EQ(MustParse(RenderConfigYaml(DaemonConfig{})), DaemonConfig{});
  DaemonConfig c;
  c.listen = "unix:/tmp/we\"ird: \\ path #x";
  c.host_pool.size = 64 * kGiB + 4096;
  c.host_pool.page_size = 3 * kMiB;
  c.host_pool.slab_size = 6 * kMiB;
  c.host_pool.hugepages = HugePagesMode::kOff;
  c.host_pool.pretouch_threads = 12;
  c.host_pool.mlock = true;
  c.device = DeviceKind::kHost;
  c.gpu_memory_budget = 1000 * kMiB;
  c.limits.max_sessions = 1;
  c.limits.max_requests_per_session = 100000;
  c.log_level = LogLevel::kError;
  ASSERT_TRUE(ValidateConfig(c).ok());
  const std::string yaml = RenderConfigYaml(c);
  EXPECT_EQ(MustParse(yaml), c) << yaml;
  EXPECT_THAT(yaml, HasSubstr("  hugepages: \"off\"\n"));
  EXPECT_THAT(yaml, HasSubstr("  slab_size: 6MiB\n"));
  // Every key's help is in the rendered file, as a comment.
  for (const ConfigKeyInfo& key : ConfigKeys()) EXPECT_THAT(yaml, HasSubstr("# " + key.help)) << key.key;
}

TEST(ConfigTest, EqualityCoversEveryKey) {
  // Each key, set away from its default, makes the configs unequal.
  const std::vector<std::pair<std::string, std::string>> changes = {{"listen", "unix:/x"},
                                                                    {"host_pool.size", "2GiB"},
                                                                    {"host_pool.page_size", "4MiB"},
                                                                    {"host_pool.slab_size", "128MiB"},
                                                                    {"host_pool.reserve_slabs", "1"},
                                                                    {"host_pool.hugepages", "off"},
                                                                    {"host_pool.pretouch_threads", "3"},
                                                                    {"host_pool.mlock", "true"},
                                                                    {"device", "host"},
                                                                    {"gpu_memory_budget", "1GiB"},
                                                                    {"gpu.arena_export", "cuda_ipc"},
                                                                    {"limits.max_sessions", "2"},
                                                                    {"limits.max_requests_per_session", "2"},
                                                                    {"limits.max_fd_connections_per_peer", "2"},
                                                                    {"limits.max_fds_in_flight_per_connection", "2"},
                                                                    {"limits.max_fds_in_flight_per_peer", "2"},
                                                                    {"limits.max_control_connections_per_peer", "2"},
                                                                    {"limits.control_lanes", "false"},
                                                                    {"limits.max_opening_sessions_per_peer", "2"},
                                                                    {"limits.session_open_timeout_ms", "2"},
                                                                    {"limits.host_arena_bytes", "64GiB"},
                                                                    {"limits.max_tokens_per_request", "4096"},
                                                                    {"access.socket_group", "hisparse"},
                                                                    {"access.allowed_uids", "1000,1001"},
                                                                    {"access.allowed_gids", "10001"},
                                                                    {"access.admin_uids", "1002"},
                                                                    {"access.admin_gids", "10002"},
                                                                    {"quotas.host_bytes", "8GiB"},
                                                                    {"quotas.arena_bytes", "1GiB"},
                                                                    {"quotas.requests", "64"},
                                                                    {"quotas.sessions", "4"},
                                                                    {"quotas.pages", "2"},
                                                                    {"admission.on_pool_full", "evict_lru_idle"},
                                                                    {"metrics.listen", ""},
                                                                    {"import.enabled", "false"},
                                                                    {"import.grant_ttl", "5"},
                                                                    {"import.ucx_tls", "tcp"},
                                                                    {"import.ucx_net_devices", "eth0"},
                                                                    {"import.worker_memory", "1GiB"},
                                                                    {"durability.max_lease_seconds", "60"},
                                                                    {"durability.max_orphans_per_tenant", "0"},
                                                                    {"durability.keep_across_restarts", "false"},
                                                                    {"log_level", "debug"},
                                                                    {"log_format", "json"},
                                                                    {"log_priority_prefix", "on"}};
  ASSERT_EQ(changes.size(), ConfigKeys().size());
  for (const auto& [key, value] : changes) {
    DaemonConfig c;
    ASSERT_TRUE(ApplyConfigOverride(c, key, value).ok()) << key;
    EXPECT_NE(c, DaemonConfig{}) << key;
  }
}

TEST(ConfigTest, MetricsListenIsHostPortOrEmpty) {
  DaemonConfig c;
  EXPECT_TRUE(ApplyConfigOverride(c, "metrics.listen", "0.0.0.0:9464").ok());
  EXPECT_TRUE(ApplyConfigOverride(c, "metrics.listen", "").ok());
  // Port 0: the kernel picks a free port (tests read it back; the daemon logs it).
  EXPECT_TRUE(ApplyConfigOverride(c, "metrics.listen", "127.0.0.1:0").ok());
  EXPECT_TRUE(ApplyConfigOverride(c, "metrics.listen", "[::1]:9464").ok());  // IPv6 in brackets
  for (const char* bad : {"9464", ":9464", "localhost:", "localhost:http", "host:70000", "host:-1", "::1:9464"}) {
    absl::Status st = ApplyConfigOverride(c, "metrics.listen", bad);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(std::string(st.message()).find("metrics.listen"), std::string::npos) << st;
  }
}

TEST(ConfigTest, AccessAndAdmissionKeys) {
  DaemonConfig c;
  ASSERT_TRUE(ApplyConfigOverride(c, "access.allowed_uids", " 1000, 1001 ").ok());
  EXPECT_THAT(c.access.allowed_uids, ::testing::ElementsAre(1000u, 1001u));
  ASSERT_TRUE(ApplyConfigOverride(c, "access.allowed_uids", "").ok());
  EXPECT_TRUE(c.access.allowed_uids.empty());
  absl::Status st = ApplyConfigOverride(c, "access.allowed_gids", "10001,abc");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("access.allowed_gids"), std::string::npos) << st;
  st = ApplyConfigOverride(c, "admission.on_pool_full", "evict_everything");
  EXPECT_NE(std::string(st.message()).find("admission.on_pool_full"), std::string::npos) << st;
  EXPECT_FALSE(ApplyConfigOverride(c, "quotas.requests", "-1").ok());
  auto parsed = ParseConfigYaml("quotas:\n  host_bytes: 4GiB\nadmission:\n  on_pool_full: evict_lru_idle\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->quotas.host_bytes, uint64_t{4} << 30);
  EXPECT_EQ(parsed->admission.on_pool_full, OnPoolFull::kEvictLruIdle);
}

TEST(ConfigTest, DiffNamesTheChangedKeys) {
  DaemonConfig a, b;
  EXPECT_TRUE(DiffConfigKeys(a, b).empty());
  ASSERT_TRUE(ApplyConfigOverride(b, "log_level", "debug").ok());
  ASSERT_TRUE(ApplyConfigOverride(b, "host_pool.size", "2GiB").ok());
  EXPECT_THAT(DiffConfigKeys(a, b), ::testing::ElementsAre("host_pool.size", "log_level"));
}

TEST(ConfigTest, KeyTable) {
  const std::vector<ConfigKeyInfo>& keys = ConfigKeys();
  std::vector<std::string> names;
  for (const ConfigKeyInfo& k : keys) {
    names.push_back(k.key);
    EXPECT_FALSE(k.type.empty()) << k.key;
    EXPECT_FALSE(k.help.empty()) << k.key;
    EXPECT_EQ(k.help.find('\n'), std::string::npos) << k.key;
    // Each default, applied as an override, leaves the defaults unchanged.
    DaemonConfig c;
    EXPECT_TRUE(ApplyConfigOverride(c, k.key, k.default_value).ok()) << k.key;
    EXPECT_EQ(c, DaemonConfig{}) << k.key;
  }
  EXPECT_THAT(
      names, ::testing::ElementsAre(
                 "listen", "host_pool.size", "host_pool.page_size", "host_pool.slab_size", "host_pool.reserve_slabs",
                 "host_pool.hugepages", "host_pool.pretouch_threads", "host_pool.mlock", "device", "gpu_memory_budget",
                 "gpu.arena_export", "limits.max_sessions", "limits.max_requests_per_session",
                 "limits.max_fd_connections_per_peer", "limits.max_fds_in_flight_per_connection",
                 "limits.max_fds_in_flight_per_peer", "limits.max_control_connections_per_peer", "limits.control_lanes",
                 "limits.max_opening_sessions_per_peer", "limits.session_open_timeout_ms", "limits.host_arena_bytes",
                 "limits.max_tokens_per_request", "access.socket_group", "access.allowed_uids", "access.allowed_gids",
                 "access.admin_uids", "access.admin_gids", "quotas.host_bytes", "quotas.arena_bytes", "quotas.requests",
                 "quotas.sessions", "quotas.pages", "admission.on_pool_full", "metrics.listen", "import.enabled",
                 "import.grant_ttl", "import.ucx_tls", "import.ucx_net_devices", "import.worker_memory",
                 "durability.max_lease_seconds", "durability.max_orphans_per_tenant", "durability.keep_across_restarts",
                 "log_level", "log_format", "log_priority_prefix"));
  EXPECT_EQ(keys[1].default_value, "1GiB");
  EXPECT_EQ(keys[2].default_value, "256KiB");
  EXPECT_EQ(keys[3].default_value, "64MiB");
  EXPECT_EQ(keys[0].default_value, "unix:/run/hisparse/hisparsed.sock");
}

TEST(ConfigTest, ListenSocketPath) {
  EXPECT_EQ(ListenSocketPath("unix:/run/x.sock"), "/run/x.sock");
  EXPECT_EQ(ListenSocketPath("unix:///run/x.sock"), "/run/x.sock");
  EXPECT_EQ(ListenSocketPath("unix:rel.sock"), "rel.sock");
  EXPECT_EQ(ListenSocketPath("tcp:1"), "");
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : ::testing::TempDir()) + "/" + name;
}

TEST(ConfigTest, LoadConfigFile) {
  const std::string path = TempPath("hisparse_config_test.yaml");
  {
    std::ofstream out(path);
    out << "host_pool:\n  size: 2GiB\n";
  }
  absl::StatusOr<DaemonConfig> c = LoadConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host_pool.size, 2 * kGiB);
  {
    std::ofstream out(path);
    out << "host_pool:\n  size: 12XB\n";
  }
  c = LoadConfigFile(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), StartsWith(path + ": host_pool.size: cannot parse"));
  std::remove(path.c_str());

  c = LoadConfigFile(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(path));
}

// A reload refuses an empty document (it would reset every quota); `{}` still means all defaults.
TEST(ConfigTest, EmptyDocumentIsRefusedWhenNotAllowed) {
  for (const char* empty : {"", "\n", "# only a comment\n", "~\n"}) {
    EXPECT_TRUE(ParseConfigYaml(empty).ok()) << empty;
    const absl::Status st = ParseConfigYaml(empty, /*allow_empty=*/false).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << empty;
    EXPECT_THAT(std::string(st.message()), HasSubstr("empty")) << empty;
  }
  EXPECT_TRUE(ParseConfigYaml("{}", /*allow_empty=*/false).ok());
  EXPECT_EQ(ParseConfigYaml("- a\n", /*allow_empty=*/false).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string path = TempPath("hisparse_empty_config_test.yaml");
  std::ofstream(path).close();
  EXPECT_EQ(LoadConfigFile(path, /*allow_empty=*/false).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LoadConfigFile(path).ok());
  std::remove(path.c_str());
}

TEST(ConfigTest, DescribeConfigChangesGivesOldAndNew) {
  DaemonConfig a, b;
  b.quotas.host_bytes = kGiB;
  b.quotas.sessions = 3;
  EXPECT_THAT(DescribeConfigChanges(a, b),
              ::testing::ElementsAre("quotas.host_bytes: \"0\" -> \"1GiB\"", "quotas.sessions: \"0\" -> \"3\""));
  EXPECT_TRUE(DescribeConfigChanges(a, a).empty());
}

// Whether `node` holds a scalar at the path parts[i..]. Recursive, because assigning yaml-cpp
// nodes rebinds the tree rather than the handle.
bool HasScalar(const YAML::Node& node, const std::vector<std::string>& parts, size_t i) {
  if (i == parts.size()) return node.IsScalar();
  if (!node.IsMap()) return false;
  const YAML::Node child = node[parts[i]];
  return child.IsDefined() && HasScalar(child, parts, i + 1);
}

// deploy/hisparsed.yaml is the documented example: it must parse, set every key to its default,
// and document each key (a comment giving its default).
TEST(ConfigTest, ExampleFileMatchesTheKeyTable) {
  const std::string path = std::string(HISPARSE_SOURCE_DIR) + "/deploy/hisparsed.yaml";
  absl::StatusOr<DaemonConfig> c = LoadConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, DaemonConfig{}) << "the example should show the defaults";

  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const YAML::Node root = YAML::Load(text.str());
  for (const ConfigKeyInfo& key : ConfigKeys()) {
    EXPECT_TRUE(HasScalar(root, absl::StrSplit(key.key, '.'), 0)) << key.key << " is missing from " << path;
    EXPECT_THAT(text.str(), HasSubstr("Default: " + key.default_value)) << key.key;
  }
}

}  // namespace config_test
}  // namespace hisparse
