// hisparse-bench: benchmarks and trace tools, one subcommand each.
#include <cstdio>
#include <cstring>

#include "bench_cmd.h"
#include "hisparse/common/version.h"

namespace {

struct Command {
  const char* name;
  int (*main)(int, char**);
  const char* help;
};

#ifndef HISPARSE_HAVE_UCX
int NeedsUcx(int, char**) {
  std::fprintf(stderr,
               "hisparse-bench: this subcommand needs a UCX build (libucx-dev was not found at configure time)\n");
  return 77;
}
#endif

#ifndef HISPARSE_HAVE_CUDA
int NeedsCuda(int, char**) {
  std::fprintf(stderr, "hisparse-bench: this subcommand needs a CUDA build (nvcc was not found at configure time)\n");
  return 2;
}
#endif

const Command kCommands[] = {
    {"trace", hisparse::bench::TraceMain, "replay a selection trace through lru / belady / staging"},
    {"gen-trace", hisparse::bench::GenTraceMain, "write a synthetic selection trace (presets dsv32, stress, local)"},
    {"control", hisparse::bench::ControlMain, "load the daemon's control plane: concurrent sessions, call latency"},
    {"grpc-floor", hisparse::bench::GrpcFloorMain, "a trivial unary gRPC call's latency and rate: control's floor"},
    {"restart", hisparse::bench::RestartMain,
     "durable requests across a SIGKILLed daemon: recovery time, admit latency"},
    {"serve", hisparse::bench::ServeMain,
     "a DeepSeek-V3.2-class decode node, full HBM vs hisparse: throughput, hit-rate curve (PyTorch)"},
    {"decode", hisparse::bench::DecodeMain, "the engine's decode step, full HBM vs hisparse, by batch (PyTorch)"},
#ifdef HISPARSE_HAVE_UCX
    {"import", hisparse::bench::ImportMain, "the prefill side of an import: put a grant's records over UCX, commit"},
#else
    {"import", NeedsUcx, "the prefill side of an import over UCX (needs a UCX build)"},
#endif
#ifdef HISPARSE_HAVE_CUDA
    {"resolve", hisparse::bench::ResolveMain, "sweep the CUDA RESOLVE kernel (GPU)"},
    {"gather", hisparse::bench::GatherMain, "scattered host records to the GPU by copy method (GPU)"},
    {"topk", hisparse::bench::TopkMain, "TOP-K's time a call by rows and blocks a row, checked (GPU)"},
    {"resolve-shared", hisparse::bench::ResolveSharedMain, "RESOLVE on the daemon's GPU arena vs an own one (GPU)"},
    {"session-open", hisparse::bench::SessionOpenMain, "time a GPU session's open: arena and host pool (GPU)"},
#else
    {"resolve", NeedsCuda, "sweep the CUDA RESOLVE kernel (GPU; needs a CUDA build)"},
    {"gather", NeedsCuda, "scattered host records to the GPU by copy method (GPU; needs a CUDA build)"},
    {"topk", NeedsCuda, "TOP-K's time a call by rows and blocks a row, checked (GPU; needs a CUDA build)"},
    {"resolve-shared", NeedsCuda, "RESOLVE on the daemon's GPU arena vs an own one (GPU; needs a CUDA build)"},
    {"session-open", NeedsCuda, "time a GPU session's open: arena and host pool (GPU; needs a CUDA build)"},
#endif
};

void Usage() {
  std::fprintf(stderr, "usage: hisparse-bench COMMAND [ARGS...]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(stderr, "  %-15s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && !std::strcmp(argv[1], "--version")) {
    std::printf("hisparse-bench %s\n", HISPARSE_VERSION);
    return 0;
  }
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    Usage();
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (!std::strcmp(argv[1], c.name)) return c.main(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "hisparse-bench: unknown command '%s'\n", argv[1]);
  Usage();
  return 2;
}
