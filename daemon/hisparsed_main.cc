// hisparsed: the per-node KV memory daemon. main() only parses flags into a DaemonConfig, starts
// the Daemon and waits for SIGTERM / SIGINT; everything else is in the hisparse_daemon library.
#include <signal.h>
#include <string.h>  // sigabbrev_np

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hisparse/common/log.h"
#include "hisparse/common/mutex_mode.h"
#include "hisparse/common/version.h"
#include "hisparse/daemon/access.h"
#include "hisparse/daemon/config.h"
#include "hisparse/daemon/daemon.h"

namespace {

// Exit statuses (docs/man/hisparsed.8, "EXIT STATUS"; sysexits.h where one fits). 0: stopped by a
// signal; 75 (EX_TEMPFAIL, hisparse::kDrainedExitCode): a drain went idle, restart wanted.
constexpr int kExitStartFailed = 1;  // the config is valid but the daemon could not start (the log says why)
constexpr int kExitUsage = 64;       // EX_USAGE: a bad command line
constexpr int kExitConfig = 78;      // EX_CONFIG: the config file or a value is refused (the key is named)

hisparse::LogSeverity ToSeverity(hisparse::LogLevel level) {
  switch (level) {
    case hisparse::LogLevel::kDebug:
      return hisparse::LogSeverity::kDebug;
    case hisparse::LogLevel::kInfo:
      return hisparse::LogSeverity::kInfo;
    case hisparse::LogLevel::kWarning:
      return hisparse::LogSeverity::kWarning;
    case hisparse::LogLevel::kError:
      return hisparse::LogSeverity::kError;
  }
  return hisparse::LogSeverity::kInfo;
}

using Overrides = std::vector<std::pair<std::string, std::string>>;

// The config a start (or --check-config) reads: the file, if any, then the overrides on top.
// Prints what is refused and returns the exit status in *exit_code.
std::optional<hisparse::DaemonConfig> LoadStartConfig(const std::string& path, bool check_only,
                                                      const Overrides& overrides, int* exit_code) {
  hisparse::DaemonConfig config;
  if (!path.empty()) {
    // --check-config refuses an empty file as a reload does: ExecReload runs it before SIGHUP,
    // and must not pass a file the reload would refuse.
    auto loaded = hisparse::LoadConfigFile(path, /*allow_empty=*/!check_only);
    if (!loaded.ok()) {
      std::fprintf(stderr, "hisparsed: %s\n", std::string(loaded.status().message()).c_str());
      *exit_code = kExitConfig;
      return std::nullopt;
    }
    config = *loaded;
  }
  for (const auto& [key, value] : overrides) {
    if (auto st = hisparse::ApplyConfigOverride(config, key, value); !st.ok()) {
      std::fprintf(stderr, "hisparsed: %s\n", std::string(st.message()).c_str());
      *exit_code = kExitConfig;
      return std::nullopt;
    }
  }
  return config;
}

// --check-config: what Daemon::Start refuses before it makes anything (keys that do not go
// together, a socket group that does not exist), or ok and the keys that differ from their
// defaults. Nothing is started: no socket, no lock, no pool.
int CheckConfigOnly(const hisparse::DaemonConfig& config, const std::string& path) {
  absl::Status st = hisparse::ValidateConfig(config);
  if (st.ok()) st = hisparse::ResolveGroup(config.access.socket_group).status();
  if (!st.ok()) {
    std::fprintf(stderr, "hisparsed: %s: %s\n", path.c_str(), std::string(st.message()).c_str());
    return kExitConfig;
  }
  const std::vector<std::string> changes = hisparse::DescribeConfigChanges(hisparse::DaemonConfig{}, config);
  std::printf("ok: %s\n", path.c_str());
  if (changes.empty()) {
    std::printf("every key has its default\n");
  } else {
    std::printf("%zu keys differ from their defaults (default -> this config):\n", changes.size());
    for (const std::string& change : changes) std::printf("  %s\n", change.c_str());
  }
  return 0;
}

// The log's threshold and shape, fixed for the process's life (a reload that changes the shape
// asks for a restart). Returns the options set.
hisparse::LogOptions ConfigureLogging(const hisparse::DaemonConfig& config) {
  hisparse::SetLogThreshold(ToSeverity(config.log_level));
  hisparse::LogOptions log;
  log.format =
      config.log_format == hisparse::LogFormatKind::kJson ? hisparse::LogFormat::kJson : hisparse::LogFormat::kText;
  log.priority_prefix = config.log_priority_prefix == hisparse::LogPrefixMode::kOn ||
                        (config.log_priority_prefix == hisparse::LogPrefixMode::kAuto && hisparse::StderrIsJournal());
  // Kubernetes' downward API (deploy/kubernetes/base/daemonset.yaml): the node this daemon serves.
  if (const char* node = std::getenv("NODE_NAME"); node != nullptr) log.node = node;
  hisparse::SetLogOptions(log);
  return log;
}

// What SIGHUP reloads: the file, then the same command-line overrides on top, as at start. An
// empty file (one being rewritten, or truncated by mistake) is refused rather than read as all
// defaults.
absl::StatusOr<hisparse::DaemonConfig> ReloadConfig(const std::string& path, const Overrides& overrides) {
  auto next = hisparse::LoadConfigFile(path, /*allow_empty=*/false);
  for (const auto& [key, value] : overrides) {
    if (!next.ok()) break;
    if (auto st = hisparse::ApplyConfigOverride(*next, key, value); !st.ok()) next = st;
  }
  if (next.ok()) {
    if (auto st = hisparse::ValidateConfig(*next); !st.ok()) next = st;
  }
  return next;
}

}  // namespace

int main(int argc, char** argv) {
  hisparse::UseReleaseMutexMode();  // before any thread: Abseil's per-lock deadlock graph, off (mutex_mode.h)
  CLI::App app{"hisparsed: per-node KV memory daemon for sparse-attention LLM serving"};
  app.set_version_flag("--version", "hisparsed " HISPARSE_VERSION);
  std::string config_path;
  CLI::Option* config_option = app.add_option("--config", config_path, "YAML config file (see deploy/hisparsed.yaml)");
  std::string check_path;
  app.add_option("--check-config", check_path,
                 "check FILE (with the flags and --set given beside it) as a start or a SIGHUP reload reads it; print "
                 "what is wrong, or ok and the keys that differ from their defaults; exit 0 or 78 without starting")
      ->excludes(config_option);
  // Each flag overrides the config key of the same meaning.
  const Overrides flag_keys = {
      {"--listen", "listen"},
      {"--host-pool-size", "host_pool.size"},
      {"--host-pool-page-size", "host_pool.page_size"},
      {"--host-pool-slab-size", "host_pool.slab_size"},
      {"--host-pool-segment-size", "host_pool.slab_size"},  // the segmented pool's flag, now the largest slab
      {"--hugepages", "host_pool.hugepages"},
      {"--pretouch-threads", "host_pool.pretouch_threads"},
      {"--device", "device"},
      {"--gpu-memory-budget", "gpu_memory_budget"},
      {"--gpu-arena-export", "gpu.arena_export"},
      {"--max-sessions", "limits.max_sessions"},
      {"--log-level", "log_level"},
      {"--metrics-listen", "metrics.listen"},
  };
  std::vector<std::string> values(flag_keys.size());
  for (size_t i = 0; i < flag_keys.size(); ++i) {
    app.add_option(flag_keys[i].first, values[i], "overrides config key " + flag_keys[i].second);
  }
  std::vector<std::string> sets;
  app.add_option("--set", sets, "KEY=VALUE: override any config key");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own codes (105-120) mean nothing to a service manager: usage errors are EX_USAGE.
    const int rc = app.exit(e);  // prints the help, the version, or what was wrong
    return rc == 0 ? 0 : kExitUsage;
  }
  Overrides overrides;
  for (size_t i = 0; i < flag_keys.size(); ++i) {
    if (app.count(flag_keys[i].first) != 0) overrides.emplace_back(flag_keys[i].second, values[i]);
  }
  for (const std::string& s : sets) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "hisparsed: --set wants KEY=VALUE, got \"%s\"\n", s.c_str());
      return kExitUsage;
    }
    overrides.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }

  const bool check_only = app.count("--check-config") > 0;
  if (check_only) config_path = check_path;
  int exit_code = 0;
  const std::optional<hisparse::DaemonConfig> loaded = LoadStartConfig(config_path, check_only, overrides, &exit_code);
  if (!loaded.has_value()) return exit_code;
  const hisparse::DaemonConfig& config = *loaded;
  if (check_only) return CheckConfigOnly(config, config_path);
  const hisparse::LogOptions log = ConfigureLogging(config);

  // Block the signals in every thread; one thread waits for them. SIGHUP reloads the config file.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  auto daemon = hisparse::Daemon::Start(config, log.node);
  if (!daemon.ok()) {
    LOG(ERROR) << "hisparsed failed to start: " << daemon.status();
    // Values every key accepts alone may still not go together (ValidateConfig): a config error.
    return absl::IsInvalidArgument(daemon.status()) ? kExitConfig : kExitStartFailed;
  }
  std::atomic<int> stop_signal{0};
  auto wait_for_signals = [&] {
    for (;;) {
      int sig = 0;
      sigwait(&stop, &sig);
      if (sig != SIGHUP) {
        // The wake-up main sends once a drain has stopped the daemon (below) is not a stop.
        if ((*daemon)->drained()) return;
        stop_signal.store(sig);
        LOG(INFO) << "signal " << sig << " (SIG" << sigabbrev_np(sig) << "): shutting down";
        (*daemon)->Shutdown();
        return;
      }
      if (config_path.empty()) {
        LOG(WARNING) << "SIGHUP: no --config file to reload";
        continue;
      }
      absl::StatusOr<hisparse::DaemonConfig> next = ReloadConfig(config_path, overrides);
      if (!next.ok()) {
        (*daemon)->ReloadRefused(next.status());
        continue;
      }
      (*daemon)->Reload(*next);
    }
  };
  std::thread waiter;
  try {
    waiter = std::thread(wait_for_signals);
  } catch (const std::system_error& e) {
    LOG(ERROR) << "hisparsed cannot start its signal thread: " << e.what();
    return kExitStartFailed;
  }
  (*daemon)->Wait();
  // Shutdown may have come from elsewhere (a drain): wake the waiter so it ends.
  // The waiter blocks in sigwait with SIGTERM blocked: this wakes it, it does not kill it.
  pthread_kill(waiter.native_handle(), SIGTERM);  // NOLINT(bugprone-bad-signal-to-kill-thread)
  waiter.join();
  // A drain's exit asks the service manager for a fresh start; a stop (signal) is final. The last
  // line says which it was, so that an exit in the journal explains itself.
  if ((*daemon)->drained()) {
    LOG(INFO) << "exiting " << hisparse::kDrainedExitCode
              << " (EX_TEMPFAIL): a drain (hisparse-ctl drain) went idle, the last session has ended; the service "
                 "manager starts a fresh daemon (systemd: RestartForceExitStatus=75; Kubernetes restarts the "
                 "container)";
    return hisparse::kDrainedExitCode;
  }
  LOG(INFO) << "exiting 0: stopped by signal " << stop_signal.load() << " (SIG"
            << (stop_signal.load() != 0 ? sigabbrev_np(stop_signal.load()) : "?") << ")";
  return 0;
}
