// Minimal structured logging to stderr (journald collects it under systemd; kubectl logs in
// Kubernetes). Debian 12's Abseil (20220623) predates absl/log, so this stands in with the same
// shape: LOG(INFO) << "..." with a settable threshold. One line per message:
//   2026-11-29T11:22:33.123456Z I hisparsed[1234] session_manager.cc:88] message
// Thread-safe: each message is formatted privately and written with one write(2).
#ifndef HISPARSE_COMMON_LOG_H_
#define HISPARSE_COMMON_LOG_H_

#include <sstream>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace hisparse {

enum class LogSeverity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogThreshold(LogSeverity severity);
bool LogEnabled(LogSeverity severity);

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
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
