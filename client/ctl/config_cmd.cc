// hisparse-ctl config: the daemon's effective configuration, as YAML (JSON-quoted with --json).
#include <cstdio>

#include <grpcpp/grpcpp.h>

#include "ctl.h"

namespace hisparse::ctl {

int ConfigCommand(const GlobalOptions& g, const CommandOptions&) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  v1::GetConfigResponse resp;
  grpc::Status st = stub->GetConfig(Context(g).get(), v1::GetConfigRequest(), &resp);
  if (!st.ok()) return ReportRpcError(st, "config");
  if (g.json) {
    std::printf("{\"yaml\": %s}\n", JsonString(resp.yaml()).c_str());
  } else {
    std::fputs(resp.yaml().c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace hisparse::ctl
