// TraceReader: streams a version-1 or version-2 selection trace, plain or gzip (zlib's gzread passes plain
// files through unchanged, so there is one code path), and never guesses at a malformed line.
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/trace/trace.h"

namespace hisparse::trace {
namespace {

constexpr absl::string_view kMagic = "hisparse-trace";

// Splits on spaces and tabs, dropping empty tokens; a trailing '\r' counts as space.
void Tokenize(absl::string_view line, std::vector<absl::string_view>* out) {
  out->clear();
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) out->push_back(line.substr(start, i - start));
  }
}

// Strict decimal: digits only (a leading '-' allowed), no '+', no spaces, no overflow. Range
// checks are the caller's, so the message can name the field.
bool ParseInt(absl::string_view s, int64_t lo, int64_t hi, int64_t* v) {
  bool neg = false;
  if (!s.empty() && s[0] == '-') neg = true, s.remove_prefix(1);
  if (s.empty() || s.size() > 18) return false;
  int64_t x = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    x = x * 10 + (c - '0');
  }
  *v = neg ? -x : x;
  return *v >= lo && *v <= hi;
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

}  // namespace

absl::StatusOr<std::unique_ptr<TraceReader>> TraceReader::Open(const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::unique_ptr<TraceReader> r(new TraceReader(path, gz));
  HS_RETURN_IF_ERROR(r->ReadHeader());
  return r;
}

TraceReader::~TraceReader() { gzclose(static_cast<gzFile>(gz_)); }

absl::Status TraceReader::Error(const std::string& what) const {
  return absl::InvalidArgumentError(absl::StrCat(path_, ":", line_ > 0 ? line_ : 1, ": ", what));
}

absl::StatusOr<bool> TraceReader::ReadLine() {
  gzFile gz = static_cast<gzFile>(gz_);
  line_text_.clear();
  bool got = false;
  while (true) {
    if (buf_pos_ == buf_.size()) {
      buf_.resize(1 << 16);
      const int n = gzread(gz, buf_.data(), static_cast<unsigned>(buf_.size()));
      // zlib hands out what it decompressed before a read error, so the error surfaces where
      // the good data ends: at the line it cut short.
      int err = Z_OK;
      const char* msg = gzerror(gz, &err);
      if (n <= 0 && err != Z_OK && err != Z_STREAM_END) {
        ++line_;
        return Error(absl::StrCat("cannot read (corrupt or truncated gzip?): ", msg));
      }
      buf_.resize(n > 0 ? n : 0);
      buf_pos_ = 0;
      if (n <= 0) break;
    }
    got = true;
    const char* start = buf_.data() + buf_pos_;
    const size_t avail = buf_.size() - buf_pos_;
    const char* nl = static_cast<const char*>(
        std::memchr(start, '\n', avail));  // NOLINT(bugprone-not-null-terminated-result): a byte search, not a string
    const size_t take = nl ? static_cast<size_t>(nl - start) : avail;
    line_text_.append(start, take);
    buf_pos_ += nl ? take + 1 : take;
    if (nl) break;
  }
  if (!got) return false;
  ++line_;
  // CRLF files are fine: one trailing CR goes. Any other CR or a NUL would make the line mean
  // different things to different tools (the writer refuses them): reject it.
  if (!line_text_.empty() && line_text_.back() == '\r') line_text_.pop_back();
  if (line_text_.find('\0') != std::string::npos) {
    return Error("NUL byte in a line: not a text trace");
  }
  if (line_text_.find('\r') != std::string::npos) {
    return Error("carriage return inside a line: not a text trace");
  }
  return true;
}

absl::Status TraceReader::ReadHeader() {
  std::vector<absl::string_view> tok;
  bool magic = false, have_k = false, have_layers = false, have_hints = false;
  int version = 1;
  while (true) {
    HS_ASSIGN_OR_RETURN(bool more, ReadLine());
    if (!more) break;
    Tokenize(line_text_, &tok);
    if (tok.empty() || tok[0][0] == '#') continue;  // blank lines and comments
    if (!magic) {
      if (tok[0] != kMagic) return Error("bad header: the first line must be 'hisparse-trace 1' or 'hisparse-trace 2'");
      if (tok.size() != 2 || (tok[1] != "1" && tok[1] != "2")) {
        return Error(absl::StrCat("bad header: unsupported version line '", line_text_,
                                  "' (this reader reads 'hisparse-trace 1' and 'hisparse-trace 2')"));
      }
      version = tok[1] == "2" ? 2 : 1;
      magic = true;
      continue;
    }
    if (tok[0] == "S") {
      pending_ = true;
      break;
    }
    if (tok[0] == "H") return Error("H line before any S line");
    // `hints` is a key of version 2; in version 1 it is a key this reader does not know, and the
    // format says to ignore it: it is dropped (kept among the extras it would clash with the key a
    // writer adds when hints exist), and the trace has no hints.
    if (version == 1 && tok[0] == "hints") continue;
    const bool hints_key = tok[0] == "hints";
    if (tok[0] == "k" || tok[0] == "layers" || hints_key) {
      bool& have = tok[0] == "k" ? have_k : hints_key ? have_hints : have_layers;
      int64_t v = 0;
      if (have) return Error(absl::StrCat("bad header: '", tok[0], "' given twice"));
      if (tok.size() != 2 || !ParseInt(tok[1], 1, kInt32Max, &v)) {
        return Error(absl::StrCat("bad header: '", tok[0], "' needs one positive integer, got '", line_text_, "'"));
      }
      (tok[0] == "k" ? header_.k : hints_key ? header_.hints : header_.layers) = static_cast<int32_t>(v);
      have = true;
      continue;
    }
    const size_t rest = static_cast<size_t>(tok[0].data() - line_text_.data()) + tok[0].size();
    header_.extra.emplace_back(std::string(tok[0]),
                               std::string(absl::StripAsciiWhitespace(absl::string_view(line_text_).substr(rest))));
  }
  if (!magic) return Error("bad header: missing 'hisparse-trace 1' (empty file?)");
  if (!have_k) return Error("bad header: 'k' missing before the first S line");
  if (!have_layers) return Error("bad header: 'layers' missing before the first S line");
  // Version 2 without the key: records may carry any number of hints (the format sets no bound).
  if (version == 2 && !have_hints) header_.hints = kInt32Max;
  checker_ = std::make_unique<TraceChecker>(header_);
  return absl::OkStatus();
}

absl::StatusOr<bool> TraceReader::Next(TraceRecord* record) {
  if (failed_) return absl::FailedPreconditionError(absl::StrCat(path_, ": reader failed earlier"));
  while (true) {
    if (!pending_) {
      absl::StatusOr<bool> more = ReadLine();
      if (!more.ok()) failed_ = true;
      if (!more.ok() || !*more) return more;
    }
    pending_ = false;
    const size_t first = line_text_.find_first_not_of(" \t\r");
    if (first == std::string::npos || line_text_[first] == '#') continue;
    absl::Status s = ParseRecord(record);
    if (s.ok() && header_.hints > 0) s = ReadHints(record);
    if (!s.ok()) {
      failed_ = true;
      return s;
    }
    return true;
  }
}

absl::Status TraceReader::ReadHints(TraceRecord* r) {
  while (true) {
    HS_ASSIGN_OR_RETURN(bool more, ReadLine());
    if (!more) return absl::OkStatus();
    const size_t first = line_text_.find_first_not_of(" \t\r");
    if (first == std::string::npos || line_text_[first] == '#') continue;
    if (line_text_[first] != 'H' ||
        (first + 1 < line_text_.size() && line_text_[first + 1] != ' ' && line_text_[first + 1] != '\t')) {
      pending_ = true;  // the next record's line
      return absl::OkStatus();
    }
    break;
  }
  std::vector<absl::string_view> tok;
  Tokenize(line_text_, &tok);
  if (tok.size() < 5) return Error("H line needs: H <step> <layer> <request> <q1> [... qm]");
  int64_t step, layer, request;
  if (!ParseInt(tok[1], 0, std::numeric_limits<int64_t>::max(), &step) || !ParseInt(tok[2], 0, kInt32Max, &layer) ||
      !ParseInt(tok[3], 0, std::numeric_limits<int64_t>::max(), &request)) {
    return Error("H line: step, layer and request must be non-negative integers");
  }
  if (step != r->step || layer != r->layer || request != r->request) {
    return Error(absl::StrCat("H line for (step ", step, ", layer ", layer, ", request ", request,
                              ") does not follow the S line of that record"));
  }
  for (size_t i = 4; i < tok.size(); ++i) {
    int64_t p;
    if (!ParseInt(tok[i], std::numeric_limits<int32_t>::min(), kInt32Max, &p)) {
      return Error(absl::StrCat("hint '", tok[i], "' is not an integer"));
    }
    r->hints.push_back(static_cast<int32_t>(p));
  }
  absl::Status s = checker_->CheckHints(*r);
  if (!s.ok()) return Error(std::string(s.message()));
  return absl::OkStatus();
}

absl::Status TraceReader::ParseRecord(TraceRecord* r) {
  std::vector<absl::string_view> tok;
  Tokenize(line_text_, &tok);
  if (tok[0] == "H") {
    return Error(header_.hints > 0 ? "H line without the S line of its record just before it"
                                   : "H line in a version-1 trace (hints need 'hisparse-trace 2')");
  }
  if (tok[0] != "S") {
    return Error(
        absl::StrCat("expected an S line, got '", tok[0], "' (header keys must come before the first S line)"));
  }
  if (tok.size() < 5) return Error("S line needs: S <step> <layer> <request> <seq_len> [positions]");
  int64_t step, layer, request, seq_len;
  if (!ParseInt(tok[1], 0, std::numeric_limits<int64_t>::max(), &step)) {
    return Error(absl::StrCat("step '", tok[1], "' is not a non-negative integer"));
  }
  if (!ParseInt(tok[2], 0, kInt32Max, &layer)) {
    return Error(absl::StrCat("layer '", tok[2], "' is not a non-negative integer"));
  }
  if (!ParseInt(tok[3], 0, std::numeric_limits<int64_t>::max(), &request)) {
    return Error(absl::StrCat("request '", tok[3], "' is not a non-negative integer"));
  }
  if (!ParseInt(tok[4], 1, kInt32Max, &seq_len)) {
    return Error(absl::StrCat("seq_len '", tok[4], "' is not an integer in [1, 2^31)"));
  }
  r->step = step;
  r->layer = static_cast<int32_t>(layer);
  r->request = request;
  r->seq_len = static_cast<int32_t>(seq_len);
  r->positions.clear();
  r->hints.clear();
  for (size_t i = 5; i < tok.size(); ++i) {
    int64_t p;
    if (!ParseInt(tok[i], std::numeric_limits<int32_t>::min(), kInt32Max, &p)) {
      return Error(absl::StrCat("position '", tok[i], "' is not an integer"));
    }
    r->positions.push_back(static_cast<int32_t>(p));
  }
  absl::Status s = checker_->Check(*r);
  if (!s.ok()) return Error(std::string(s.message()));
  return absl::OkStatus();
}

}  // namespace hisparse::trace
