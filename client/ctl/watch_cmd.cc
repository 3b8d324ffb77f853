// hisparse-ctl watch: stats, refreshed in place every --interval seconds (like top).
#include <chrono>
#include <cstdio>
#include <thread>

#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include "ctl.h"

namespace hisparse::ctl {

int WatchCommand(const GlobalOptions& g, const CommandOptions& o) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  for (int n = 0; o.count == 0 || n < o.count; ++n) {
    if (n > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o.interval_s));
    v1::StatsResponse s;
    grpc::Status st = stub->Stats(Context(g).get(), v1::StatsRequest(), &s);
    if (!st.ok()) return ReportRpcError(st, "stats");
    // JSON: one object per refresh and line; terminal: clear and redraw; a pipe or file: the
    // tables one after another, with no terminal escapes.
    if (!g.json && tty) {
      std::printf("\033[H\033[2J%s — every %.1f s (Ctrl-C to stop)\n\n", g.daemon.c_str(), o.interval_s);
    } else if (!g.json) {
      std::printf("%s%s — refresh %d\n\n", n > 0 ? "\n" : "", g.daemon.c_str(), n + 1);
    }
    PrintStats(s, g.json);
    std::fflush(stdout);
  }
  return kExitOk;
}

}  // namespace hisparse::ctl
