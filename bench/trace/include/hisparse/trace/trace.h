// Selection traces, version 1 (TRACE_FORMAT.md): a streaming reader and a writer.
//
// TraceReader reads a plain or gzip-compressed trace (zlib reads both through one path) one S
// line at a time, validating as it goes, and rejects a malformed file with "PATH:LINE: what was
// wrong". TraceWriter writes one (gzip-compressed when the path ends in ".gz") and holds records
// to the same rules, so it never writes a file the reader rejects.
//
// Ownership: each object owns its open file and closes it on destruction. Thread-safety: none;
// use one object from one thread at a time.
#ifndef HISPARSE_TRACE_TRACE_H_
#define HISPARSE_TRACE_TRACE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hisparse::trace {

// The header: k and layers are required; other keys are kept in file order for writers that copy
// them, and otherwise ignored.
struct TraceHeader {
  int32_t k = 0;
  int32_t layers = 0;
  std::vector<std::pair<std::string, std::string>> extra;  // (key, rest of the line)
};

// One S line: the positions (n <= k, no padding) one request selected in one layer at one step.
struct TraceRecord {
  int64_t step = 0;
  int32_t layer = 0;
  int64_t request = 0;
  int32_t seq_len = 0;
  std::vector<int32_t> positions;
};

// The cross-record rules of the format: steps non-decreasing, (layer, request) at most once per
// step, and each record's own rules (layer range, positions in [0, seq_len), unique, <= k).
// Shared by the reader and the writer.
class TraceChecker {
 public:
  explicit TraceChecker(const TraceHeader& header) : k_(header.k), layers_(header.layers) {}
  // OK and remembers the record, or INVALID_ARGUMENT saying what is wrong (no line number).
  absl::Status Check(const TraceRecord& r);

 private:
  int32_t k_;
  int32_t layers_;
  int64_t step_ = -1;
  std::set<std::pair<int32_t, int64_t>> seen_;  // (layer, request) pairs of step_
  std::vector<int32_t> scratch_;
};

class TraceReader {
 public:
  // Opens `path` and reads its header. NOT_FOUND when it cannot be opened; INVALID_ARGUMENT
  // ("PATH:LINE: ...") when the header is malformed.
  static absl::StatusOr<std::unique_ptr<TraceReader>> Open(const std::string& path);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  const TraceHeader& header() const { return header_; }
  // Reads the next S line into *record: true, or false at the end of the file. INVALID_ARGUMENT
  // ("PATH:LINE: ...") on a malformed line; the reader is then unusable.
  absl::StatusOr<bool> Next(TraceRecord* record);
  // Line number of the last line read (1-based).
  int64_t line() const { return line_; }

 private:
  TraceReader(std::string path, void* gz) : path_(std::move(path)), gz_(gz) {}
  // Reads one line without its newline into line_text_: false at end of file.
  absl::StatusOr<bool> ReadLine();
  absl::Status ReadHeader();
  absl::Status ParseRecord(TraceRecord* record);
  absl::Status Error(const std::string& what) const;

  std::string path_;
  void* gz_;  // gzFile; void* keeps zlib.h out of this header
  int64_t line_ = 0;
  std::string line_text_;
  std::string buf_;  // decompressed bytes not yet consumed start at buf_pos_
  size_t buf_pos_ = 0;
  bool pending_ = false;  // line_text_ holds the first S line, read while looking for the header
  bool failed_ = false;
  TraceHeader header_;
  std::unique_ptr<TraceChecker> checker_;
};

class TraceWriter {
 public:
  // Creates `path` (gzip when it ends in ".gz") and writes the header. INVALID_ARGUMENT for a bad
  // header (k or layers < 1); INTERNAL when the file cannot be created.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Create(const std::string& path, const TraceHeader& header);
  ~TraceWriter();  // closes the file; call Close() to see its status
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Appends one S line; INVALID_ARGUMENT (nothing written) when it breaks the format's rules.
  absl::Status Write(const TraceRecord& record);
  absl::Status Close();

 private:
  TraceWriter(std::string path, void* gz, const TraceHeader& header)
      : path_(std::move(path)), gz_(gz), checker_(header) {}

  std::string path_;
  void* gz_;  // gzFile
  TraceChecker checker_;
};

}  // namespace hisparse::trace

#endif  // HISPARSE_TRACE_TRACE_H_
