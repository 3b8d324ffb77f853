#include "hisparse/common/log.h"

#include <errno.h>  // program_invocation_short_name
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace hisparse {
namespace {
std::atomic<int> g_threshold{static_cast<int>(LogSeverity::kInfo)};
// Set at start-up and never freed: a message being formatted on another thread may still read
// the previous options.
std::atomic<const LogOptions*> g_options{nullptr};
constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
constexpr const char* kNames[] = {"debug", "info", "warning", "error"};
constexpr int kSyslogPriority[] = {7, 6, 4, 3};  // LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR

// A JSON string literal of `s` (RFC 8259: quote, backslash and control bytes escaped).
void AppendJsonString(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}
}  // namespace

void SetLogThreshold(LogSeverity severity) { g_threshold.store(static_cast<int>(severity)); }
bool LogEnabled(LogSeverity severity) { return static_cast<int>(severity) >= g_threshold.load(); }

void SetLogOptions(const LogOptions& options) {
  // Readers load the pointer without a lock, so an options object is never freed: each stays
  // owned by this list (reachable, so LeakSanitizer does not count it), one per call. Called at
  // start-up (and by tests), so the list stays short.
  static std::mutex mu;
  static auto* const every = new std::vector<std::unique_ptr<const LogOptions>>();
  auto owned = std::make_unique<const LogOptions>(options);
  g_options.store(owned.get());
  std::lock_guard<std::mutex> lock(mu);
  every->push_back(std::move(owned));
}

LogOptions GetLogOptions() {
  const LogOptions* set = g_options.load();
  return set != nullptr ? *set : LogOptions{};
}

bool StderrIsJournal() {
  const char* env = std::getenv("JOURNAL_STREAM");
  if (env == nullptr) return false;
  const std::vector<std::string> parts = absl::StrSplit(env, ':');
  uint64_t dev = 0, ino = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &dev) || !absl::SimpleAtoi(parts[1], &ino)) return false;
  struct stat st {};
  return ::fstat(STDERR_FILENO, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

LogMessage::LogMessage(LogSeverity severity, const char* file, int line)
    : severity_(severity), file_(file), line_(line) {
  timeval tv;
  ::gettimeofday(&tv, nullptr);
  seconds_ = tv.tv_sec;
  micros_ = tv.tv_usec;
}

LogMessage::~LogMessage() {
  static const LogOptions kDefaults;
  const LogOptions* set = g_options.load();
  const LogOptions& o = set != nullptr ? *set : kDefaults;
  const int sev = static_cast<int>(severity_);
  tm utc;
  const time_t secs = seconds_;
  ::gmtime_r(&secs, &utc);
  char when[64];
  const size_t n = std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(when + n, sizeof(when) - n, ".%06ldZ", micros_);
  const char* base = std::strrchr(file_, '/');
  const std::string source = absl::StrCat(base ? base + 1 : file_, ":", line_);
  std::string out;
  if (o.priority_prefix) absl::StrAppend(&out, "<", kSyslogPriority[sev], ">");
  if (o.format == LogFormat::kJson) {
    absl::StrAppend(&out, "{\"time\":\"", when, "\",\"level\":\"", kNames[sev], "\",\"program\":");
    AppendJsonString(out, program_invocation_short_name);
    absl::StrAppend(&out, ",\"pid\":", ::getpid());
    if (!o.node.empty()) {
      out += ",\"node\":";
      AppendJsonString(out, o.node);
    }
    out += ",\"source\":";
    AppendJsonString(out, source);
    out += ",\"message\":";
    AppendJsonString(out, stream_.str());
    out += "}\n";
  } else {
    absl::StrAppend(&out, when, " ", std::string(1, kLetters[sev]), " ", program_invocation_short_name, "[", ::getpid(),
                    "] ", source, "] ", stream_.str(), "\n");
  }
  (void)!::write(STDERR_FILENO, out.data(), out.size());
}

}  // namespace hisparse
