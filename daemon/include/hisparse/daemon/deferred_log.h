// DeferredLog: log lines composed under a lock and written once it is released, so that no
// thread waits on stderr (journald, a full pipe) while holding the daemon's lock.
//
//   DeferredLog log;                 // declared before the lock: destroyed, and written, after it
//   absl::MutexLock lock(&mu_);
//   DEFERRED_LOG(log, INFO) << "session " << id << " ...";
//
// Lines keep the file and line of their DEFERRED_LOG and are written in order by Flush (or the
// destructor). Below the log threshold nothing is composed, as with LOG.
#ifndef HISPARSE_DAEMON_DEFERRED_LOG_H_
#define HISPARSE_DAEMON_DEFERRED_LOG_H_

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "hisparse/common/log.h"

namespace hisparse {

class DeferredLog {
 public:
  // One line being composed; it joins its log when the statement ends.
  class Line {
   public:
    Line(DeferredLog* log, LogSeverity severity, const char* file, int line)
        : log_(log), severity_(severity), file_(file), line_(line) {}
    Line(const Line&) = delete;
    Line& operator=(const Line&) = delete;
    ~Line() { log_->lines_.push_back(Entry{severity_, file_, line_, stream_.str()}); }
    std::ostream& stream() { return stream_; }

   private:
    DeferredLog* log_;
    LogSeverity severity_;
    const char* file_;
    int line_;
    std::ostringstream stream_;
  };

  DeferredLog() = default;
  DeferredLog(const DeferredLog&) = delete;
  DeferredLog& operator=(const DeferredLog&) = delete;
  ~DeferredLog() { Flush(); }

  // Writes every line so far, in order. Call it only without the lock.
  void Flush() {
    std::vector<Entry> lines = std::exchange(lines_, {});
    for (const Entry& e : lines) LogMessage(e.severity, e.file, e.line).stream() << e.text;
  }

 private:
  struct Entry {
    LogSeverity severity;
    const char* file;
    int line;
    std::string text;
  };
  std::vector<Entry> lines_;
};

}  // namespace hisparse

// NOLINTBEGIN(bugprone-macro-parentheses): a stream expression, used as DEFERRED_LOG(log, x) << ...
#define DEFERRED_LOG(deferred, severity)              \
  !::hisparse::LogEnabled(HS_LOG_SEVERITY_##severity) \
      ? (void)0                                       \
      : ::hisparse::LogVoidify() &                    \
            ::hisparse::DeferredLog::Line(&(deferred), HS_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // HISPARSE_DAEMON_DEFERRED_LOG_H_
