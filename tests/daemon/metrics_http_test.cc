// MetricsHttp (metrics_http.h): the daemon's own /metrics server for IPv6 addresses. Its answer to
// each request head, and the server itself on ::1: a scrape is answered while more idle
// connections than it serves at once are open, and a head over the limit gets 431.
#include "hisparse/daemon/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {
namespace {

const MetricsHttp::Render kRender = [] { return std::string("hisparse_up 1\n"); };

TEST(MetricsHttpResponseTest, ServesMetricsAndRefusesTheRest) {
  const std::string ok = MetricsHttpResponse("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", kRender);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << ok;
  EXPECT_NE(ok.find("Content-Length: 14\r\n"), std::string::npos) << ok;
  EXPECT_NE(ok.find("Connection: close\r\n\r\nhisparse_up 1\n"), std::string::npos) << ok;
  EXPECT_EQ(MetricsHttpResponse("GET /metrics?x=1 HTTP/1.0\r\n\r\n", kRender).rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(MetricsHttpResponse("GET / HTTP/1.1\r\n\r\n", kRender).rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(MetricsHttpResponse("POST /metrics HTTP/1.1\r\n\r\n", kRender).rfind("HTTP/1.1 405", 0), 0u);
  for (const char* bad : {"\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET /metrics SPDY/3\r\n\r\n",
                          "GET  /metrics HTTP/1.1\r\n\r\n"}) {
    EXPECT_EQ(MetricsHttpResponse(bad, kRender).rfind("HTTP/1.1 400", 0), 0u) << bad;
  }
}

TEST(MetricsHttpTest, RefusesAddressesThatAreNotBracketedIpv6) {
  for (const char* bad : {"127.0.0.1:9464", "[::1]", "[::1]:x", "[::1]:70000", "[nope]:1", ""}) {
    EXPECT_EQ(MetricsHttp::Start(bad, kRender).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// A connection to [::1]:port, or invalid where there is no IPv6 loopback.
UniqueFd Connect6(int port) {
  UniqueFd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_addr = in6addr_loopback;
  sa.sin6_port = htons(static_cast<uint16_t>(port));
  if (!fd.valid() || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return UniqueFd();
  timeval tv{60, 0};  // a watchdog against a hang; no timing is tested
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string Exchange(int fd, const std::string& request) {
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) return "";
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(MetricsHttpTest, IdleConnectionsAndOversizedHeadsDoNotStopAScrape) {
  auto server = MetricsHttp::Start("[::1]:0", kRender);
  if (!server.ok() && server.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "this host has no IPv6 loopback (::1): " << server.status();
  }
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  // More idle connections than the server serves at once: they take its slots and the backlog,
  // and are dropped at the head deadline; the scrape behind them is then answered.
  std::vector<UniqueFd> idle;
  for (int i = 0; i < MetricsHttp::kMaxConnections + 8; ++i) idle.push_back(Connect6(port));
  UniqueFd big = Connect6(port);
  ASSERT_TRUE(big.valid());
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(MetricsHttp::kMaxHeadBytes, 'a') + "\r\n\r\n";
  UniqueFd scrape = Connect6(port);
  ASSERT_TRUE(scrape.valid());
  const std::string got = Exchange(scrape.get(), "GET /metrics HTTP/1.1\r\nHost: [::1]\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK", 0), 0u) << got;
  EXPECT_NE(got.find("\r\n\r\nhisparse_up 1\n"), std::string::npos) << got;
  EXPECT_EQ(Exchange(big.get(), huge).rfind("HTTP/1.1 431", 0), 0u);
  // Each idle connection was closed by the server (end of file), not left open.
  for (UniqueFd& fd : idle) {
    if (!fd.valid()) continue;
    char c;
    EXPECT_EQ(::recv(fd.get(), &c, 1, 0), 0);
  }
}

}  // namespace
}  // namespace hisparse
