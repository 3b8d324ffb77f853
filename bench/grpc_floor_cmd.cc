// `hisparse-bench grpc-floor`: what one unary gRPC call costs on this host with nothing behind it,
// the floor under every control-plane figure of `hisparse-bench control`.
//
//   hisparse-bench grpc-floor [--clients N] [--calls M] [--server sync|callback]
//
// Starts, in a child process (as hisparsed is one), a server of the daemon's service
// (hisparse.v1.HiSparse) whose Stats answers at once with one field set and nothing looked up, on
// a unix socket in a new temporary directory, as hisparsed listens; the server is gRPC's
// synchronous one (as hisparsed's) or its callback one. Then N client threads of this process
// (default 1; as `control`'s sessions are), each on a channel and connection of its own (as each
// engine session has), make M Stats calls each (default 5000) back to back, and every call's
// latency is kept. Output: one JSON object (p50/p90/p99 in microseconds, calls per second
// over the whole run). Exit codes: 0 ok; 1 a call failed; 2 bad usage.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench_cmd.h"
#include "hisparse/v1/hisparse.grpc.pb.h"

namespace hisparse::bench {
namespace {

constexpr char kUsage[] =
    "usage: hisparse-bench grpc-floor [--clients N] [--calls M] [--server sync|callback]\n"
    "  N client threads (default 1), each on its own connection, make M unary calls each (default\n"
    "  5000) to a trivial server of the daemon's service on a unix socket in this process; prints\n"
    "  their latency percentiles and calls per second as JSON: the floor under `control`.\n";

int Usage(const std::string& why) {
  std::fprintf(stderr, "hisparse-bench grpc-floor: %s\n%s", why.c_str(), kUsage);
  return 2;
}

// Stats answered at once: the least a unary call of this service can cost.
class SyncFloor final : public v1::HiSparse::Service {
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse* resp) override {
    resp->set_sessions(1);
    return grpc::Status::OK;
  }
};
class CallbackFloor final : public v1::HiSparse::WithCallbackMethod_Stats<v1::HiSparse::Service> {
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context, const v1::StatsRequest*,
                                  v1::StatsResponse* resp) override {
    resp->set_sessions(1);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

struct Options {
  int clients = 1;
  int calls = 5000;
  bool callback = false;
};

// The calls' latencies in nanoseconds, or the first failure's message.
struct ClientResult {
  std::vector<uint32_t> ns;
  std::string error;
};

void RunClient(const std::string& address, int calls, ClientResult* out) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, as each session has
  auto stub = v1::HiSparse::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  out->ns.reserve(calls);
  for (int i = 0; i < calls; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::StatsRequest req;
    v1::StatsResponse resp;
    const auto t = std::chrono::steady_clock::now();
    const grpc::Status st = stub->Stats(&context, req, &resp);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t);
    if (!st.ok() || resp.sessions() != 1) {
      out->error = absl::StrCat("call ", i, ": ", st.ok() ? "wrong answer" : st.error_message());
      return;
    }
    out->ns.push_back(static_cast<uint32_t>(std::min<int64_t>(ns.count(), UINT32_MAX)));
  }
}

// The child's life: serve until `stop` reads end of file. Returns its exit code.
int Serve(const std::string& address, bool callback, int ready, int stop) {
  SyncFloor sync_service;
  CallbackFloor callback_service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  if (callback) {
    builder.RegisterService(&callback_service);
  } else {
    builder.RegisterService(&sync_service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const char up = server != nullptr ? 'y' : 'n';
  (void)::write(ready, &up, 1);
  ::close(ready);
  if (server == nullptr) return 1;
  char byte;
  while (::read(stop, &byte, 1) > 0) {
  }
  server->Shutdown();
  return 0;
}

double Percentile(const std::vector<uint32_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * static_cast<double>(sorted.size())))] / 1e3;
}

}  // namespace

int GrpcFloorMain(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {  // argv[0]: the subcommand's name
    std::string name, value;
    if (std::string(argv[i]) == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!TakeFlag(argc, argv, &i, &name, &value)) return Usage(name + " needs a value");
    int n = 0;
    if (name == "--clients" && absl::SimpleAtoi(value, &n) && n >= 1 && n <= 4096) {
      o.clients = n;
    } else if (name == "--calls" && absl::SimpleAtoi(value, &n) && n >= 1) {
      o.calls = n;
    } else if (name == "--server" && (value == "sync" || value == "callback")) {
      o.callback = value == "callback";
    } else {
      return Usage(absl::StrCat("bad argument '", name, "' '", value, "'"));
    }
  }
  char dir_template[] = "/tmp/hisparse-grpc-floor-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return Usage("cannot make a temporary directory");
  const std::string dir = dir_template;
  const std::string address = "unix:" + dir + "/floor.sock";
  // The server runs in a child forked before this process touches gRPC. It says it is up on
  // `ready`, and stops when `stop` reaches end of file (this process closed it, or died).
  int ready[2], stop[2];
  if (::pipe(ready) != 0 || ::pipe(stop) != 0) return Usage("cannot make pipes");
  const pid_t child = ::fork();
  if (child < 0) return Usage("cannot fork the server");
  if (child == 0) {
    ::close(ready[0]);
    ::close(stop[1]);
    _exit(Serve(address, o.callback, ready[1], stop[0]));
  }
  ::close(ready[1]);
  ::close(stop[0]);
  char up = 0;
  const bool started = ::read(ready[0], &up, 1) == 1 && up == 'y';
  ::close(ready[0]);
  auto stop_server = [&] {
    ::close(stop[1]);
    int status = 0;
    ::waitpid(child, &status, 0);
    ::unlink((dir + "/floor.sock").c_str());
    ::rmdir(dir.c_str());
  };
  if (!started) {
    stop_server();
    std::fprintf(stderr, "hisparse-bench grpc-floor: the server did not start on %s\n", address.c_str());
    return 1;
  }
  std::vector<ClientResult> results(o.clients);
  const auto start = std::chrono::steady_clock::now();
  {
    std::vector<std::thread> threads;
    threads.reserve(o.clients);
    for (int c = 0; c < o.clients; ++c) threads.emplace_back(RunClient, address, o.calls, &results[c]);
    for (std::thread& t : threads) t.join();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stop_server();
  std::vector<uint32_t> all;
  for (const ClientResult& r : results) {
    if (!r.error.empty()) {
      std::fprintf(stderr, "hisparse-bench grpc-floor: %s\n", r.error.c_str());
      return 1;
    }
    all.insert(all.end(), r.ns.begin(), r.ns.end());
  }
  std::sort(all.begin(), all.end());
  std::printf("%s\n", absl::StrFormat("{\"server\": \"%s\", \"clients\": %d, \"calls\": %d, \"seconds\": %.3f, "
                                      "\"calls_per_s\": %.0f, \"p50_us\": %.1f, \"p90_us\": %.1f, \"p99_us\": %.1f}",
                                      o.callback ? "callback" : "sync", o.clients, static_cast<int>(all.size()),
                                      seconds, static_cast<double>(all.size()) / seconds, Percentile(all, 0.5),
                                      Percentile(all, 0.9), Percentile(all, 0.99))
                          .c_str());
  return 0;
}

}  // namespace hisparse::bench
