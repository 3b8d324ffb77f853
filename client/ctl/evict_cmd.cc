// hisparse-ctl evict REQUEST --session ID: the engine is told first, then the memory is released.
#include <cstdio>

#include <grpcpp/grpcpp.h>

#include "ctl.h"
#include "hisparse/common/size_parse.h"

namespace hisparse::ctl {

int EvictCommand(const GlobalOptions& g, const CommandOptions& o) {
  auto stub = Connect(g);
  if (stub == nullptr) return kExitUnreachable;
  v1::EvictRequest req;
  req.set_session_id(o.session);
  req.set_request_id(o.request);
  req.set_reason(o.reason);
  v1::EvictResponse resp;
  grpc::Status st = stub->Evict(Context(g).get(), req, &resp);
  if (!st.ok()) return ReportRpcError(st, "evict");
  if (g.json) {
    std::printf("{\"session_id\": %lu, \"request_id\": %lu, \"freed_bytes\": %lu}\n", o.session, o.request,
                resp.freed_bytes());
  } else {
    std::printf("evicted request %lu of session %lu: %s freed\n", o.request, o.session,
                FormatByteSize(resp.freed_bytes()).c_str());
  }
  return kExitOk;
}

}  // namespace hisparse::ctl
