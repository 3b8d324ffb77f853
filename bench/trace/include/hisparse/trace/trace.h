// Selection traces, versions 1 and 2 (TRACE_FORMAT.md): a streaming reader and a writer.
//
// Version 2 adds optional retention hints: any S line may be followed by one H line for the same
// record, `H <step> <layer> <request> <q1> ... <qm>` with m >= 1, bounded by the optional header key
// `hints h` (this implementation's; m <= h; without it no bound, and in version 1 the key is one a
// reader ignores, as every unknown key, while an H line is an error there): the positions its
// indexer ranked k+1 .. k+m, best first (rank order is part of the data: the first h' of them are
// the record's hints at depth h' < h). Hints are unique, in [0, seq_len) and none is selected by
// the same record. A record without an H line has no hints. A version-2 reader reads version 1
// unchanged; the writer writes version 2 exactly when its header says hints > 0.
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
  int32_t hints = 0;  // h: at most this many hints a record; 0: none (version 1); INT32_MAX: v2 without the key
  std::vector<std::pair<std::string, std::string>> extra;  // (key, rest of the line)
};

// One S line: the positions (n <= k, no padding) one request selected in one layer at one step,
// and its H line's retention hints (m <= header hints, best first; empty without an H line).
struct TraceRecord {
  int64_t step = 0;
  int32_t layer = 0;
  int64_t request = 0;
  int32_t seq_len = 0;
  std::vector<int32_t> positions;
  std::vector<int32_t> hints;
};

// The cross-record rules of the format: steps non-decreasing, (layer, request) at most once per
// step, and each record's own rules (layer range, positions in [0, seq_len), unique, <= k; hints
// <= h, in [0, seq_len), unique, none selected). Shared by the reader and the writer.
class TraceChecker {
 public:
  explicit TraceChecker(const TraceHeader& header) : k_(header.k), layers_(header.layers), hints_(header.hints) {}
  // OK and remembers the record, or INVALID_ARGUMENT saying what is wrong (no line number).
  absl::Status Check(const TraceRecord& r);
  // The hint rules alone, for the record Check passed last (the reader checks an S line first and
  // its H line when it has read it).
  absl::Status CheckHints(const TraceRecord& r);

 private:
  int32_t k_;
  int32_t layers_;
  int32_t hints_;
  int64_t step_ = -1;
  std::set<std::pair<int32_t, int64_t>> seen_;  // (layer, request) pairs of step_
  std::vector<int32_t> scratch_, hint_scratch_;
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
  // Reads the next S line (and its H line, if any) into *record: true, or false at the end of the
  // file. INVALID_ARGUMENT ("PATH:LINE: ...") on a malformed line; the reader is then unusable.
  absl::StatusOr<bool> Next(TraceRecord* record);
  // Line number of the last line read (1-based).
  int64_t line() const { return line_; }

 private:
  TraceReader(std::string path, void* gz) : path_(std::move(path)), gz_(gz) {}
  // Reads one line without its newline into line_text_: false at end of file.
  absl::StatusOr<bool> ReadLine();
  absl::Status ReadHeader();
  absl::Status ParseRecord(TraceRecord* record);
  // After an S line: reads the next record line; an H line fills record->hints, anything else
  // stays pending for the next call.
  absl::Status ReadHints(TraceRecord* record);
  absl::Status Error(const std::string& what) const;

  std::string path_;
  void* gz_;  // gzFile; void* keeps zlib.h out of this header
  int64_t line_ = 0;
  std::string line_text_;
  std::string buf_;  // decompressed bytes not yet consumed start at buf_pos_
  size_t buf_pos_ = 0;
  bool pending_ = false;  // line_text_ holds a line read ahead (the first S line, or the line after an S line)
  bool failed_ = false;
  TraceHeader header_;
  std::unique_ptr<TraceChecker> checker_;
};

class TraceWriter {
 public:
  // Creates `path` (gzip when it ends in ".gz") and writes the header: version 2 with `hints h`
  // when header.hints > 0, else version 1. INVALID_ARGUMENT for a bad header (k or layers < 1,
  // hints < 0); INTERNAL when the file cannot be created.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Create(const std::string& path, const TraceHeader& header);
  ~TraceWriter();  // closes the file; call Close() to see its status
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Appends one S line and, when the record has hints, its H line; INVALID_ARGUMENT (nothing
  // written) when it breaks the format's rules (hints in a version-1 trace among them).
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
