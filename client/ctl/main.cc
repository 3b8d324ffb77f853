// hisparse-ctl: look at and steer a running hisparsed.
#include <cstdio>
#include <cstdlib>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "ctl.h"

namespace hisparse::ctl {

std::unique_ptr<v1::HiSparse::Stub> Connect(const GlobalOptions& g) {
  if (g.daemon.rfind("unix:", 0) != 0) {
    std::fprintf(stderr, "hisparse-ctl: --daemon must be unix:PATH, got \"%s\"\n", g.daemon.c_str());
    return nullptr;
  }
  auto channel = grpc::CreateChannel(g.daemon, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(g.timeout_ms))) {
    std::fprintf(stderr, "hisparse-ctl: cannot reach hisparsed at %s\n", g.daemon.c_str());
    return nullptr;
  }
  return v1::HiSparse::NewStub(channel);
}

int ReportRpcError(const grpc::Status& s, const char* what) {
  std::fprintf(stderr, "hisparse-ctl: %s: %s\n", what, s.error_message().c_str());
  const auto code = s.error_code();
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ? kExitUnreachable
                                                                                              : kExitRefused;
}

}  // namespace hisparse::ctl

int main(int argc, char** argv) {
  using namespace hisparse::ctl;
  CLI::App app{"hisparse-ctl: admin CLI for hisparsed"};
  app.require_subcommand(1);
  GlobalOptions g;
  if (const char* env = std::getenv("HISPARSE_DAEMON"); env != nullptr && *env) g.daemon = env;
  app.add_option("--daemon", g.daemon, "daemon address, unix:PATH (default $HISPARSE_DAEMON or /run/hisparse/hisparsed.sock)");
  app.add_flag("--json", g.json, "machine-readable JSON output");
  app.add_option("--timeout-ms", g.timeout_ms, "deadline for reaching the daemon and each call");

  // The command table: name, help, handler.
  struct Command {
    const char* name;
    const char* help;
    int (*run)(const GlobalOptions&);
  };
  const Command commands[] = {
      {"stats", "host pool capacity, use and fragmentation; sessions and requests", StatsCommand},
  };
  std::vector<std::pair<CLI::App*, const Command*>> subs;
  for (const Command& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    sub->add_flag("--json", g.json, "machine-readable JSON output");
    subs.emplace_back(sub, &c);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUnreachable;
  }
  for (auto& [sub, c] : subs) {
    if (sub->parsed()) return c->run(g);
  }
  return kExitUnreachable;
}
