#include "hisparse/daemon/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"

namespace hisparse {
namespace {

// "[ADDR]:PORT" as an IPv6 socket address.
absl::StatusOr<sockaddr_in6> ParseBracketed(const std::string& address) {
  const size_t close = address.find("]:");
  int port = -1;
  if (address.empty() || address.front() != '[' || close == std::string::npos ||
      !absl::SimpleAtoi(address.substr(close + 2), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", address, "\" is not an IPv6 listen address of the form [ADDR]:PORT"));
  }
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_port = htons(static_cast<uint16_t>(port));
  const std::string host = address.substr(1, close - 1);
  if (::inet_pton(AF_INET6, host.c_str(), &sa.sin6_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("\"", host, "\" is not an IPv6 address"));
  }
  return sa;
}

std::string Reply(const char* status, const std::string& content_type, const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type, "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

// One connection: reading its head, then writing its response.
struct Conn {
  UniqueFd fd;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool writing = false;
  absl::Time deadline;
};

}  // namespace

std::string MetricsHttpResponse(const std::string& head, const MetricsHttp::Render& render) {
  const size_t line_end = head.find("\r\n");
  const std::string line = head.substr(0, line_end);
  const std::vector<std::string> parts = [&] {
    std::vector<std::string> p;
    size_t at = 0;
    for (size_t sp; (sp = line.find(' ', at)) != std::string::npos; at = sp + 1) p.push_back(line.substr(at, sp - at));
    p.push_back(line.substr(at));
    return p;
  }();
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    return Reply("400 Bad Request", "text/plain", "a request line of METHOD PATH HTTP/1.x\n");
  }
  if (parts[0] != "GET") return Reply("405 Method Not Allowed", "text/plain", "only GET\n");
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") return Reply("404 Not Found", "text/plain", "hisparsed serves /metrics\n");
  return Reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", render());
}

absl::StatusOr<std::unique_ptr<MetricsHttp>> MetricsHttp::Start(const std::string& address, Render render) {
  absl::StatusOr<sockaddr_in6> sa = ParseBracketed(address);
  if (!sa.ok()) return sa.status();
  UniqueFd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::UnavailableError(absl::StrCat("socket(AF_INET6): ", std::strerror(errno)));
  const int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*sa), sizeof(*sa)) != 0 || ::listen(fd.get(), 64) != 0) {
    const int err = errno;
    return absl::UnavailableError(err == EADDRINUSE ? absl::StrCat("the port of ", address, " is in use")
                                  : err == EADDRNOTAVAIL
                                      ? absl::StrCat("no interface of this host has the address of ", address)
                                      : absl::StrCat("binding ", address, ": ", std::strerror(err)));
  }
  sockaddr_in6 bound{};
  socklen_t len = sizeof(bound);
  (void)::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return absl::UnavailableError("pipe2 for the metrics server");
  std::unique_ptr<MetricsHttp> server(new MetricsHttp(std::move(fd), ntohs(bound.sin6_port), std::move(render)));
  server->wake_read_.Reset(wake[0]);
  server->wake_write_.Reset(wake[1]);
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsHttp::MetricsHttp(UniqueFd listener, int port, Render render)
    : listener_(std::move(listener)), port_(port), render_(std::move(render)) {}

MetricsHttp::~MetricsHttp() {
  wake_write_.Reset();  // Serve sees the pipe's end of file
  if (thread_.joinable()) thread_.join();
}

void MetricsHttp::Serve() {
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  absl::Time accept_again = absl::InfinitePast();  // after a failed accept (out of descriptors)
  for (;;) {
    const absl::Time now = absl::Now();
    // Drop what is done or late; the earliest deadline left bounds the wait.
    conns.erase(
        std::remove_if(conns.begin(), conns.end(), [&](const Conn& c) { return !c.fd.valid() || now >= c.deadline; }),
        conns.end());
    absl::Duration wait = absl::InfiniteDuration();
    for (const Conn& c : conns) wait = std::min(wait, c.deadline - now);
    const bool accepting = conns.size() < kMaxConnections && now >= accept_again;
    if (now < accept_again) wait = std::min(wait, accept_again - now);
    fds.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    fds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});
    for (const Conn& c : conns) fds.push_back({c.fd.get(), static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
    const int timeout_ms =
        wait == absl::InfiniteDuration() ? -1 : static_cast<int>(absl::ToInt64Milliseconds(wait) + 1);
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      LOG(ERROR) << "metrics server: poll: " << std::strerror(errno) << "; it stops";
      return;
    }
    if (fds[0].revents != 0) return;  // stopping
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (fds[i + 2].revents == 0) continue;
      if (!c.writing) {
        char buf[2048];
        const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          c.fd.Reset();
          continue;
        }
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        const size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos && c.in.size() <= kMaxHeadBytes) continue;
        c.out = end == std::string::npos || end + 4 > kMaxHeadBytes
                    ? Reply("431 Request Header Fields Too Large", "text/plain", "request head too large\n")
                    : MetricsHttpResponse(c.in.substr(0, end + 4), render_);
        c.in.clear();
        c.writing = true;
        c.deadline = absl::Now() + kResponseTimeout;
      }
      const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        c.fd.Reset();
        continue;
      }
      if (n > 0) c.sent += static_cast<size_t>(n);
      if (c.sent == c.out.size()) c.fd.Reset();  // Connection: close
    }
    if (accepting && (fds[1].revents & POLLIN) != 0) {
      while (conns.size() < kMaxConnections) {
        UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd.valid()) {
          // Out of descriptors (or memory): the listener stays readable, so wait a little rather
          // than spin; the backlog keeps the connections meanwhile.
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            accept_again = absl::Now() + absl::Milliseconds(100);
          }
          break;
        }
        conns.push_back(Conn{std::move(fd), {}, {}, 0, false, absl::Now() + kHeadTimeout});
      }
    }
  }
}

}  // namespace hisparse
