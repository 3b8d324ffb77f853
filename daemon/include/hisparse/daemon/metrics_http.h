// MetricsHttp: the /metrics endpoint on a TCP socket of the daemon's own, for the addresses
// civetweb (prometheus-cpp's HTTP server) cannot take: IPv6, where civetweb was built without it
// (Debian 12's libcivetweb1 is). MetricsServer (metrics.h) picks it for "[ADDR]:PORT" only then.
//
// HTTP/1.0 and 1.1 GET of /metrics (200, the text exposition, version 0.0.4); any other path 404,
// any other method 405, a head over kMaxHeadBytes 431; one response per connection (Connection:
// close), so no keep-alive state. One thread serves every connection with poll(), non-blocking:
//   - a connection must send its request head within kHeadTimeout of its accept and take the
//     response within kResponseTimeout, else it is dropped;
//   - at most kMaxConnections are open at once; while they are, the listener is not polled and the
//     kernel's backlog holds new ones (each of which then meets the same deadlines).
// So idle or slow peers delay a scrape by at most those timeouts, as civetweb's workers with their
// request timeout do, and hold no thread or unbounded memory.
#ifndef HISPARSE_DAEMON_METRICS_HTTP_H_
#define HISPARSE_DAEMON_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {

class MetricsHttp {
 public:
  static constexpr int kMaxConnections = 32;
  static constexpr size_t kMaxHeadBytes = 8192;
  static constexpr absl::Duration kHeadTimeout = absl::Seconds(2);
  static constexpr absl::Duration kResponseTimeout = absl::Seconds(10);

  // The exposition text, rendered for each scrape (on the server's thread).
  using Render = std::function<std::string()>;
  // Listens on `address` ("[ADDR]:PORT", PORT 0: one the kernel picks) and starts serving.
  // InvalidArgument for an address of another shape; Unavailable, naming the errno, when it
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttp>> Start(const std::string& address, Render render);
  // Stops the thread and closes the listener and every connection.
  ~MetricsHttp();
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttp(UniqueFd listener, int port, Render render);
  void Serve();

  const UniqueFd listener_;
  const int port_;
  const Render render_;
  UniqueFd wake_read_, wake_write_;  // a byte (or the write end's close) stops Serve
  std::thread thread_;
};

// The response to one request head (everything up to and including its blank line): the status
// line, headers and body. A pure function, for the tests; Serve sends what it returns.
std::string MetricsHttpResponse(const std::string& head, const MetricsHttp::Render& render);

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_METRICS_HTTP_H_
