// The subcommands of hisparse-bench. Each takes the arguments after its name and returns the
// process exit code (0 ok, 1 failed, 2 bad usage). Results go to stdout as JSON.
#ifndef HISPARSE_BENCH_BENCH_CMD_H_
#define HISPARSE_BENCH_BENCH_CMD_H_

namespace hisparse::bench {

int TraceMain(int argc, char** argv);          // trace_cmd.cc: replay a selection trace through a policy
int GenTraceMain(int argc, char** argv);       // gen_trace_cmd.cc: write a synthetic selection trace
int ResolveMain(int argc, char** argv);        // resolve_cmd.cu: the RESOLVE kernel sweep (CUDA builds)
int ControlMain(int argc, char** argv);        // control_cmd.cc: load on the daemon's control plane
int SessionOpenMain(int argc, char** argv);    // session_open_cmd.cc: GPU session open phases (CUDA)
int ResolveSharedMain(int argc, char** argv);  // resolve_shared_cmd.cc: daemon's arena vs own (CUDA)

}  // namespace hisparse::bench

#endif  // HISPARSE_BENCH_BENCH_CMD_H_
