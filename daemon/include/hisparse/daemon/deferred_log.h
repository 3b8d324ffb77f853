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

// LogDeferral: while one lives on a thread, LOCKED_LOG's lines on that thread join its log, which
// is written when the outermost one goes; with none alive they are written at once. The daemon's
// lock guards hold one (NodeLock and HotSession, session_core.h), declared before their locks are
// taken and gone after they are released, so a line reached deep under a lock (an accounting
// error in a shared primitive, a module's notice) never makes the lock's holder wait on stderr.
// Nested deferrals share the outermost's log: nothing is written while any lock of the thread is
// held.
class LogDeferral {
 public:
  LogDeferral() : outer_(active_ != nullptr) {
    if (!outer_) active_ = &log_;
  }
  ~LogDeferral() {
    if (!outer_) active_ = nullptr;  // log_ is written next, by its own destructor
  }
  LogDeferral(const LogDeferral&) = delete;
  LogDeferral& operator=(const LogDeferral&) = delete;

  // The thread's active log, or null when no deferral lives on it.
  static DeferredLog* Active() { return active_; }

 private:
  inline static thread_local DeferredLog* active_ = nullptr;
  const bool outer_;  // another deferral was active: this one's log stays unused
  DeferredLog log_;
};

}  // namespace hisparse

// NOLINTBEGIN(bugprone-macro-parentheses): a stream expression, used as DEFERRED_LOG(log, x) << ...
#define DEFERRED_LOG(deferred, severity)              \
  !::hisparse::LogEnabled(HS_LOG_SEVERITY_##severity) \
      ? (void)0                                       \
      : ::hisparse::LogVoidify() &                    \
            ::hisparse::DeferredLog::Line(&(deferred), HS_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()
// LOCKED_LOG(x) << ...: into the thread's LogDeferral when one lives (written once its locks are
// released), else at once, as LOG(x). The daemon's request-lifecycle modules log only this way or
// through DEFERRED_LOG (tests/daemon/check_layering.py holds them to it).
#define LOCKED_LOG(severity)                                                                                    \
  !::hisparse::LogEnabled(HS_LOG_SEVERITY_##severity)                                                           \
      ? (void)0                                                                                                 \
      : ::hisparse::LogVoidify() &                                                                              \
            (::hisparse::LogDeferral::Active() != nullptr                                                       \
                 ? ::hisparse::DeferredLog::Line(::hisparse::LogDeferral::Active(), HS_LOG_SEVERITY_##severity, \
                                                 __FILE__, __LINE__)                                            \
                       .stream()                                                                                \
                 : ::hisparse::LogMessage(HS_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream())
// NOLINTEND(bugprone-macro-parentheses)

#endif  // HISPARSE_DAEMON_DEFERRED_LOG_H_
