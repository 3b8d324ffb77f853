// hisparse-ctl drain: stop admitting, wait for the sessions to end; the daemon then exits.
// hisparse-ctl drain --cancel: end a drain; the daemon admits again and does not exit.
#include <chrono>
#include <cstdio>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "ctl.h"

namespace hisparse::ctl {

int DrainCommand(const GlobalOptions& g, const CommandOptions& o) {
  auto channel = ConnectChannel(g);
  if (channel == nullptr) return kExitUnreachable;
  auto stub = v1::HiSparse::NewStub(channel);
  v1::DrainRequest req;
  v1::DrainResponse resp;
  if (o.cancel) {
    req.set_cancel(true);
    grpc::Status st = stub->Drain(Context(g).get(), req, &resp);
    if (!st.ok()) return ReportRpcError(st, "drain --cancel");
    if (g.json) {
      std::printf("{\"cancelled\": %s, \"sessions\": %u}\n", resp.was_draining() ? "true" : "false", resp.sessions());
    } else if (resp.was_draining()) {
      std::printf("drain cancelled: admitting again, %u sessions open; the daemon no longer exits once idle\n",
                  resp.sessions());
    } else {
      std::printf("not draining: nothing to cancel\n");
    }
    return kExitOk;
  }
  req.set_exit_when_idle(true);
  grpc::Status st = stub->Drain(Context(g).get(), req, &resp);
  if (!st.ok()) return ReportRpcError(st, "drain");
  if (!g.json) std::printf("draining: %u sessions open; no new sessions or admissions\n", resp.sessions());
  if (o.no_wait) return kExitOk;
  // The daemon exits once idle: wait until it stops answering.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.drain_timeout_s);
  uint32_t last = resp.sessions();
  while (std::chrono::steady_clock::now() < deadline) {
    v1::StatsResponse s;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(g.timeout_ms));
    grpc::Status ss = stub->Stats(&ctx, v1::StatsRequest(), &s);
    if (!ss.ok()) {
      if (g.json) {
        std::printf("{\"drained\": true}\n");
      } else {
        std::printf("drained: the daemon has exited\n");
      }
      return kExitOk;
    }
    if (!s.draining()) {  // hisparse-ctl drain --cancel
      std::fprintf(stderr, "hisparse-ctl: drain: cancelled (%u sessions open); the daemon admits again\n",
                   s.sessions());
      return kExitRefused;
    }
    if (!g.json && s.sessions() != last) std::printf("  %u sessions left\n", s.sessions());
    last = s.sessions();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::fprintf(stderr, "hisparse-ctl: drain: %u sessions still open after %d s\n", last, o.drain_timeout_s);
  return kExitRefused;
}

}  // namespace hisparse::ctl
