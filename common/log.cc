#include "hisparse/common/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <ctime>

namespace hisparse {
namespace {
std::atomic<int> g_threshold{static_cast<int>(LogSeverity::kInfo)};
constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
}  // namespace

void SetLogThreshold(LogSeverity severity) { g_threshold.store(static_cast<int>(severity)); }
bool LogEnabled(LogSeverity severity) { return static_cast<int>(severity) >= g_threshold.load(); }

LogMessage::LogMessage(LogSeverity severity, const char* file, int line) {
  timeval tv;
  ::gettimeofday(&tv, nullptr);
  tm utc;
  ::gmtime_r(&tv.tv_sec, &utc);
  char when[40];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &utc);
  const char* base = std::strrchr(file, '/');
  stream_ << when << '.' << std::to_string(1000000 + tv.tv_usec).substr(1) << "Z "
          << kLetters[static_cast<int>(severity)] << ' ' << program_invocation_short_name << '[' << ::getpid() << "] "
          << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string s = stream_.str();
  (void)!::write(STDERR_FILENO, s.data(), s.size());
}

}  // namespace hisparse
