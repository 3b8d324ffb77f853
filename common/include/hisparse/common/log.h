// Minimal structured logging to stderr (journald collects it under systemd; kubectl logs in
// Kubernetes). Debian 12's Abseil (20220623) predates absl/log, so this stands in with the same
// shape: LOG(INFO) << "..." with a settable threshold. One line per message, text:
//   2026-11-29T11:22:33.123456Z I hisparsed[1234] session_manager.cc:88] message
// or JSON (LogFormat::kJson), one object per line, "node" only when set:
//   {"time":"2026-11-29T11:22:33.123456Z","level":"info","program":"hisparsed","pid":1234,
//    "node":"gpu-7","source":"session_manager.cc:88","message":"..."}
// With a priority prefix, each line starts with its syslog priority, "<3>" error, "<4>" warning,
// "<6>" info, "<7>" debug, which journald strips and keeps as the entry's PRIORITY.
// Thread-safe: each message is formatted privately and written with one write(2); set the
// options (SetLogOptions) before other threads log.
#ifndef HISPARSE_COMMON_LOG_H_
#define HISPARSE_COMMON_LOG_H_

#include <sstream>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace hisparse {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogThreshold(LogSeverity severity);
bool LogEnabled(LogSeverity severity);

enum class LogFormat { kText, kJson };
struct LogOptions {
  LogFormat format = LogFormat::kText;
  bool priority_prefix = false;  // "<N>" before each line, for journald
  std::string node;              // the node's name (JSON "node"); empty: left out
};
// Replaces the options of every later message. Call at start-up, before other threads log.
void SetLogOptions(const LogOptions& options);
// The options now (defaults if never set): what a child process that logs to the same stderr
// (hisparse-import-worker) is started with.
LogOptions GetLogOptions();
// Whether stderr is a stream to the journal: systemd then sets JOURNAL_STREAM to its
// "device:inode", which must match stderr's (a child that inherited the variable but writes
// elsewhere does not match).
bool StderrIsJournal();

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  const char* file_;
  int line_;
  long seconds_;
  long micros_;
  std::ostringstream stream_;  // the message only; the line is put together when it ends
};

// Lets `LOG(x) << a << b` compile to nothing below the threshold.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace hisparse

#define HS_LOG_SEVERITY_DEBUG ::hisparse::LogSeverity::kDebug
#define HS_LOG_SEVERITY_INFO ::hisparse::LogSeverity::kInfo
#define HS_LOG_SEVERITY_WARNING ::hisparse::LogSeverity::kWarning
#define HS_LOG_SEVERITY_ERROR ::hisparse::LogSeverity::kError

// NOLINTBEGIN(bugprone-macro-parentheses): a stream expression, used as LOG(x) << ...
#define LOG(severity)                                 \
  !::hisparse::LogEnabled(HS_LOG_SEVERITY_##severity) \
      ? (void)0                                       \
      : ::hisparse::LogVoidify() & ::hisparse::LogMessage(HS_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // HISPARSE_COMMON_LOG_H_
