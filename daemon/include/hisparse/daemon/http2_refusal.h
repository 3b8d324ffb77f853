// Http2Refusal: the answer to a gRPC client whose connection the daemon will not serve (the
// control socket's per-uid cap, access.h), given without gRPC: the connection never reaches the
// server, and costs the daemon one descriptor for a moment.
//
// A gRPC client shows nothing of a connection that is closed at once (it fails UNAVAILABLE, "Broken
// pipe" or "Socket closed") nor of a GOAWAY before its first call (it reconnects until its
// deadline). What it does show is a call's status. So the refusal speaks just enough HTTP/2 to
// answer the client's first call: the server preface (an empty SETTINGS frame) at once; then,
// reading what the client sends, an ACK of its SETTINGS and, on the first stream it opens (its
// first HEADERS frame), a trailers-only response with grpc-status RESOURCE_EXHAUSTED and
// grpc-message `message`, followed by a GOAWAY (ENHANCE_YOUR_CALM, last stream that one, `message`
// as debug data). The client's header block is not decoded: only frame headers are read.
//
// Plain value, no I/O: the caller moves the bytes. Not thread-safe (one connection's).
#ifndef HISPARSE_DAEMON_HTTP2_REFUSAL_H_
#define HISPARSE_DAEMON_HTTP2_REFUSAL_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace hisparse {

class Http2Refusal {
 public:
  explicit Http2Refusal(std::string message);
  // What to send as soon as the connection is accepted.
  static std::string ServerPreface();
  // Takes bytes the client sent; returns the bytes to send in answer (possibly none). Once the
  // refusal has been returned, answered() is true and later bytes are dropped.
  std::string Feed(absl::string_view bytes);
  bool answered() const { return answered_; }
  // The client broke the protocol (no preface, an oversized frame): close without an answer.
  bool failed() const { return failed_; }

  // The pieces, for tests: the trailers-only response on `stream` and the GOAWAY after it.
  static std::string TrailersOnly(uint32_t stream, absl::string_view message);
  static std::string Goaway(uint32_t last_stream, absl::string_view debug);

 private:
  std::string message_;
  std::string in_;  // client bytes not yet parsed
  bool preface_seen_ = false;
  bool answered_ = false;
  bool failed_ = false;
};

}  // namespace hisparse

#endif  // HISPARSE_DAEMON_HTTP2_REFUSAL_H_
