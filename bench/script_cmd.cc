// hisparse-bench serve and hisparse-bench decode: the PyTorch engine benchmarks
// (examples/engine/serve_bench.py, decode_bench.py) under the names the docs and issue 44 give
// them. The subcommand finds the script and runs it with the arguments after its name, in place of
// this process (execv: its exit status is the script's).
//
// Where the script is looked for: $HISPARSE_SOURCE_DIR/examples/engine when that is set (another
// checkout than the one this binary was built from), else the first of ./examples/engine (run from
// a checkout's root: the GPU host's copy of the tree) and the source tree this binary was built
// from (HISPARSE_BUILD_SOURCE_DIR, set by CMake).
// The interpreter is $PYTHON, else python3 on PATH. Unless they are set already, the script is given
// HISPARSE_DAEMON_BIN (the hisparsed beside this binary) and HISPARSE_LIB (libhisparse.so beside it
// or in ../lib), so that it runs this build's daemon and client, not whatever else it would find.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_cmd.h"
#include "hisparse/common/daemon_process.h"

namespace hisparse::bench {
namespace {

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The script's path, or empty; *tried lists every place looked at. A $HISPARSE_SOURCE_DIR that
// lacks the script is an error, not a reason to run another checkout's.
std::string FindScript(const std::string& name, std::string* tried) {
  std::vector<std::string> roots;
  if (const char* env = std::getenv("HISPARSE_SOURCE_DIR"); env != nullptr && *env != 0) {
    roots.emplace_back(env);
  } else {
    roots.emplace_back(".");
#ifdef HISPARSE_BUILD_SOURCE_DIR
    roots.emplace_back(HISPARSE_BUILD_SOURCE_DIR);
#endif
  }
  for (const std::string& root : roots) {
    std::string path = root;
    path.append("/examples/engine/").append(name);
    if (IsFile(path)) return path;
    tried->append("\n  ").append(path);
  }
  return {};
}

// Sets `var` to the first of `candidates` that is a file, unless `var` is set already.
void DefaultEnv(const char* var, const std::vector<std::string>& candidates) {
  if (std::getenv(var) != nullptr) return;
  for (const std::string& c : candidates) {
    if (IsFile(c)) {
      ::setenv(var, c.c_str(), 0);
      return;
    }
  }
}

int RunScript(const char* command, const std::string& script_name, int argc, char** argv) {
  std::string tried;
  const std::string script = FindScript(script_name, &tried);
  if (script.empty()) {
    std::fprintf(stderr,
                 "hisparse-bench %s: cannot find %s; looked at:%s\n(set HISPARSE_SOURCE_DIR to a hisparse checkout)\n",
                 command, script_name.c_str(), tried.c_str());
    return 2;
  }
  const std::string dir = ExecutableDir();
  if (!dir.empty()) {
    DefaultEnv("HISPARSE_DAEMON_BIN", {dir + "/hisparsed"});
    DefaultEnv("HISPARSE_LIB", {dir + "/libhisparse.so", dir + "/../lib/libhisparse.so"});
  }
  const char* env_python = std::getenv("PYTHON");
  const std::string python = env_python != nullptr && *env_python != 0 ? env_python : "python3";
  std::vector<char*> args;
  args.push_back(const_cast<char*>(python.c_str()));
  args.push_back(const_cast<char*>(script.c_str()));
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execvp(python.c_str(), args.data());
  std::fprintf(stderr, "hisparse-bench %s: cannot run %s: %s (set PYTHON to a Python 3 with torch)\n", command,
               python.c_str(), std::strerror(errno));
  return 2;
}

}  // namespace

int ServeMain(int argc, char** argv) { return RunScript("serve", "serve_bench.py", argc, argv); }

int DecodeMain(int argc, char** argv) { return RunScript("decode", "decode_bench.py", argc, argv); }

}  // namespace hisparse::bench
