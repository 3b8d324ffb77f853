// The subcommands of hisparse-bench. Each takes the arguments after its name and returns the
// process exit code (0 ok, 1 failed, 2 bad usage). Results go to stdout as JSON.
#ifndef HISPARSE_BENCH_BENCH_CMD_H_
#define HISPARSE_BENCH_BENCH_CMD_H_

#include <cstdlib>
#include <string>
#include <vector>

namespace hisparse::bench {

// One "--name VALUE" or "--name=VALUE" argument at argv[*i]: sets *name, and *value from after
// the '=' or from argv[*i + 1] (then consumed: *i advances). Returns false, *name still set, when
// the value is missing.
inline bool TakeFlag(int argc, char** argv, int* i, std::string* name, std::string* value) {
  const std::string arg = argv[*i];
  const size_t eq = arg.find('=');
  *name = arg.substr(0, eq);
  if (eq != std::string::npos) {
    *value = arg.substr(eq + 1);
    return true;
  }
  if (*i + 1 >= argc) return false;
  *value = argv[++*i];
  return true;
}

// A comma-separated list of numbers ("1,10,64"); empty items are skipped.
template <typename T>
inline std::vector<T> ParseList(const char* s) {
  std::vector<T> out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == 0) {
      if (!cur.empty()) out.push_back(static_cast<T>(std::atof(cur.c_str())));
      cur.clear();
      if (!*p) break;
    } else {
      cur += *p;
    }
  }
  return out;
}

// A comma-separated list of words; empty items are skipped.
inline std::vector<std::string> ParseWords(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == 0) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      if (!*p) break;
    } else {
      cur += *p;
    }
  }
  return out;
}

int TraceMain(int argc, char** argv);          // trace_cmd.cc: replay a selection trace through a policy
int GenTraceMain(int argc, char** argv);       // gen_trace_cmd.cc: write a synthetic selection trace
int ResolveMain(int argc, char** argv);        // resolve_cmd.cu: the RESOLVE kernel sweep (CUDA builds)
int GatherMain(int argc, char** argv);         // gather_cmd.cu: host records to the GPU by copy method (CUDA)
int TopkMain(int argc, char** argv);           // topk_cmd.cc: TOP-K's time a call by rows and blocks a row (CUDA)
int ResolveDraftMain(int argc, char** argv);   // resolve_draft_cmd.cc: resolve --draft-tokens (CUDA builds)
int ControlMain(int argc, char** argv);        // control_cmd.cc: load on the daemon's control plane
int GrpcFloorMain(int argc, char** argv);      // grpc_floor_cmd.cc: a trivial unary call's cost, the floor
int RestartMain(int argc, char** argv);        // restart_cmd.cc: durable requests across a daemon's SIGKILL
int SessionOpenMain(int argc, char** argv);    // session_open_cmd.cc: GPU session open phases (CUDA)
int ResolveSharedMain(int argc, char** argv);  // resolve_shared_cmd.cc: daemon's arena vs own (CUDA)
int ImportMain(int argc, char** argv);         // import_cmd.cc: write a grant's records over UCX (UCX builds)
int ServeMain(int argc, char** argv);          // script_cmd.cc: examples/engine/serve_bench.py (PyTorch)
int DecodeMain(int argc, char** argv);         // script_cmd.cc: examples/engine/decode_bench.py (PyTorch)

}  // namespace hisparse::bench

#endif  // HISPARSE_BENCH_BENCH_CMD_H_
