// Helpers for the trace tests: a per-test temporary directory, file writers, a whole-trace reader,
// and a runner of hisparse-bench's trace subcommands. Owns its
// directory (removed on destruction); not thread-safe.
#ifndef HISPARSE_TESTS_TRACE_TRACE_TEST_UTIL_H_
#define HISPARSE_TESTS_TRACE_TRACE_TEST_UTIL_H_

#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_cmd.h"
#include "gtest/gtest.h"
#include "hisparse/trace/trace.h"

namespace hisparse::trace::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "hisparse-trace-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Path(const std::string& name) const { return (path_ / name).string(); }

  // Writes `text` to `name`, gzip-compressed when the name ends in ".gz"; returns the path.
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = Path(name);
    if (name.size() > 3 && name.substr(name.size() - 3) == ".gz") {
      gzFile gz = gzopen(p.c_str(), "wb");
      gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
      gzclose(gz);
    } else {
      std::ofstream(p, std::ios::binary) << text;
    }
    return p;
  }

 private:
  std::filesystem::path path_;
};

// Every record of the trace at `path` (and its header), with a test failure on any error.
inline std::vector<TraceRecord> ReadAll(const std::string& path, TraceHeader* header) {
  auto reader = TraceReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return {};
  *header = (*reader)->header();
  std::vector<TraceRecord> out;
  TraceRecord r;
  while (true) {
    auto more = (*reader)->Next(&r);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    out.push_back(r);
  }
  return out;
}

// Runs a hisparse-bench subcommand's main (bench::TraceMain, bench::GenTraceMain) with `args`
// after its name; *out gets what it printed on stdout. Returns its exit code.
inline int RunCommand(int (*main_fn)(int, char**), const char* name, std::vector<std::string> args, std::string* out) {
  args.insert(args.begin(), name);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  const int rc = main_fn(static_cast<int>(argv.size()), argv.data());
  *out = ::testing::internal::GetCapturedStdout();
  return rc;
}

}  // namespace hisparse::trace::testing

#endif  // HISPARSE_TESTS_TRACE_TRACE_TEST_UTIL_H_
