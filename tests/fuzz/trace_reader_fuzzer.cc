// Fuzz target: the selection-trace reader (TRACE_FORMAT.md), plain and gzip. The input is
// written to a file (TraceReader reads paths) and read to the end or to its first error; it must
// never crash or hang. Every record the reader accepts must also be accepted by a TraceWriter
// with the same header: the two share one set of rules, and a writer that refuses what the reader
// takes (or the reverse) would make traces that round-trip in one direction only.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_check.h"
#include "fuzz_reach.h"
#include "hisparse/trace/trace.h"

namespace {

using hisparse::fuzz::Fail;
using hisparse::fuzz::Reached;

constexpr int kMaxRecords = 100000;  // a gzip bomb must end in bounded time

void RemoveScratchDir();

// One scratch directory per process: parallel fuzzing jobs (-jobs=N) must not share files. In
// /dev/shm when there is one: two files are written per input, and a disk-backed /tmp halves the
// executions per second.
const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    std::string tmpl =
        ::access("/dev/shm", W_OK) == 0 ? "/dev/shm/hisparse-trace-fuzz-XXXXXX" : "/tmp/hisparse-trace-fuzz-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) Fail("mkdtemp failed");
    std::atexit(RemoveScratchDir);  // else every run leaves a folder in /dev/shm (memory)
    return new std::string(tmpl);
  }();
  return *dir;
}

void RemoveScratchDir() {
  const std::string& dir = ScratchDir();
  std::remove((dir + "/input.trace").c_str());
  std::remove((dir + "/output.trace").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace

// What the replay holds the corpus to (fuzz_reach.h): headers refused, records read and refused,
// traces read to their end.
HS_FUZZ_STEP_KINDS("header refused", "record", "record refused", "end of trace")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using hisparse::trace::TraceReader;
  using hisparse::trace::TraceRecord;
  using hisparse::trace::TraceWriter;
  const std::string input = ScratchDir() + "/input.trace";
  const std::string output = ScratchDir() + "/output.trace";
  FILE* f = std::fopen(input.c_str(), "wb");
  if (f == nullptr) Fail("cannot write " + input);
  if (size > 0 && std::fwrite(data, 1, size, f) != size) Fail("short write to " + input);
  std::fclose(f);

  auto reader = TraceReader::Open(input);
  if (!reader.ok()) {
    if (!absl::IsInvalidArgument(reader.status())) Fail("Open: unexpected code: " + reader.status().ToString());
    Reached("header refused");
    return 0;
  }
  auto writer = TraceWriter::Create(output, (*reader)->header());
  if (!writer.ok()) Fail("the writer refuses a header the reader accepted: " + writer.status().ToString());
  TraceRecord record;
  for (int i = 0; i < kMaxRecords; ++i) {
    absl::StatusOr<bool> more = (*reader)->Next(&record);
    if (!more.ok()) {
      if (!absl::IsInvalidArgument(more.status())) Fail("Next: unexpected code: " + more.status().ToString());
      Reached("record refused");
      break;
    }
    if (!*more) {
      Reached("end of trace");
      break;
    }
    absl::Status st = (*writer)->Write(record);
    if (!st.ok()) Fail("the writer refuses a record the reader accepted: " + st.ToString());
    Reached("record");
  }
  (void)(*writer)->Close();
  return 0;
}
