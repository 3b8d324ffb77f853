// TraceWriter: writes a version-1 selection trace (version 2 when the header has hints), gzip-compressed when the path
// ends in ".gz".
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/trace/trace.h"

namespace hisparse::trace {

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Create(const std::string& path, const TraceHeader& header) {
  if (header.k < 1 || header.layers < 1 || header.hints < 0) {
    return absl::InvalidArgumentError("trace header needs k >= 1, layers >= 1 and hints >= 0");
  }
  for (const auto& [key, value] : header.extra) {
    if (key.empty() || key == "k" || key == "layers" || key == "hints" || key == "S" || key == "H" || key[0] == '#' ||
        key.find_first_of(" \t\r\n") != std::string::npos || value.find_first_of("\r\n") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad extra header key '", key, "'"));
    }
  }
  // "wT" writes the file uncompressed through the same gz* calls.
  gzFile gz = gzopen(path.c_str(), absl::EndsWith(path, ".gz") ? "wb6" : "wT");
  if (gz == nullptr) {
    return absl::InternalError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  gzbuffer(gz, 1 << 17);
  std::unique_ptr<TraceWriter> w(new TraceWriter(path, gz, header));
  std::string head =
      absl::StrCat("hisparse-trace ", header.hints > 0 ? 2 : 1, "\nk ", header.k, "\nlayers ", header.layers, "\n");
  if (header.hints > 0) absl::StrAppend(&head, "hints ", header.hints, "\n");
  for (const auto& [key, value] : header.extra) absl::StrAppend(&head, key, " ", value, "\n");
  if (gzputs(gz, head.c_str()) < 0) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return w;
}

TraceWriter::~TraceWriter() {
  if (gz_ != nullptr) gzclose(static_cast<gzFile>(gz_));
}

absl::Status TraceWriter::Write(const TraceRecord& r) {
  if (gz_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(path_, ": closed"));
  HS_RETURN_IF_ERROR(checker_.Check(r));
  std::string line = absl::StrCat("S ", r.step, " ", r.layer, " ", r.request, " ", r.seq_len);
  for (int32_t p : r.positions) absl::StrAppend(&line, " ", p);
  line.push_back('\n');
  if (!r.hints.empty()) {
    absl::StrAppend(&line, "H ", r.step, " ", r.layer, " ", r.request);
    for (int32_t p : r.hints) absl::StrAppend(&line, " ", p);
    line.push_back('\n');
  }
  if (gzwrite(static_cast<gzFile>(gz_), line.data(), static_cast<unsigned>(line.size())) !=
      static_cast<int>(line.size())) {
    return absl::InternalError(absl::StrCat(path_, ": write failed"));
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::Close() {
  if (gz_ == nullptr) return absl::OkStatus();
  const int rc = gzclose(static_cast<gzFile>(gz_));
  gz_ = nullptr;
  if (rc != Z_OK) return absl::InternalError(absl::StrCat(path_, ": close failed (", rc, ")"));
  return absl::OkStatus();
}

}  // namespace hisparse::trace
