// hisparse.hpp — a thin, header-only C++ wrapper over the C ABI (hisparse.h): RAII for the
// session handle and a small Error value instead of exceptions. Nothing here is compiled into the
// library, so the ABI stays C.
#ifndef HISPARSE_HISPARSE_HPP_
#define HISPARSE_HISPARSE_HPP_

#include <cstdint>
#include <string>
#include <utility>

#include "hisparse/hisparse.h"

namespace hisparse {

// The outcome of a call: code plus the library's message for it.
struct Error {
  hs_result code = HS_OK;
  std::string message;
  bool ok() const { return code == HS_OK; }
  explicit operator bool() const { return !ok(); }  // `if (auto err = ...)` reads as "if failed"
  static Error From(hs_result r) { return r == HS_OK ? Error{} : Error{r, hs_last_error()}; }
};

// Owns one hs_session. Move-only; closing (or destroying) ends the session.
class Session {
 public:
  Session() = default;
  ~Session() { Close(); }
  Session(Session&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Session& operator=(Session&& o) noexcept {
    if (this != &o) {
      Close();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  static Error Open(const hs_session_options& options, Session* out) {
    hs_session* s = nullptr;
    Error e = Error::From(hs_session_open(&options, &s));
    if (e.ok()) *out = Session(s);
    return e;
  }
  void Close() {
    hs_session_close(s_);
    s_ = nullptr;
  }
  hs_session* get() const { return s_; }
  bool is_open() const { return s_ != nullptr; }

  Error Admit(uint64_t id, uint32_t context_tokens, uint32_t token_budget, hs_request_info* info = nullptr) {
    hs_request_info local = HS_REQUEST_INFO_INIT;
    return Error::From(hs_admit(s_, id, context_tokens, token_budget, info ? info : &local));
  }
  // Since ABI 1.10: one admission with every option (hs_admit2); the calls below are its older forms.
  Error Admit(const hs_admit_args& args, hs_request_info* info = nullptr) {
    hs_request_info local = HS_REQUEST_INFO_INIT;
    return Error::From(hs_admit2(s_, &args, info ? info : &local));
  }
  Error Extend(uint64_t id, uint32_t token_budget, hs_request_info* info = nullptr) {
    hs_request_info local = HS_REQUEST_INFO_INIT;
    return Error::From(hs_extend(s_, id, token_budget, info ? info : &local));
  }
  Error Release(uint64_t id) { return Error::From(hs_release(s_, id)); }
  // Since ABI 1.6.
  Error AdmitShared(uint64_t id, uint32_t context_tokens, uint32_t token_budget, uint64_t parent,
                    uint32_t prefix_tokens, hs_request_info* info = nullptr) {
    hs_request_info local = HS_REQUEST_INFO_INIT;
    return Error::From(
        hs_admit_shared(s_, id, context_tokens, token_budget, parent, prefix_tokens, info ? info : &local));
  }
  // Since ABI 1.7: hs_admit for the session's TP group.
  Error AdmitGroup(uint64_t id, uint32_t context_tokens, uint32_t token_budget, hs_request_info* info = nullptr) {
    hs_request_info local = HS_REQUEST_INFO_INIT;
    return Error::From(hs_admit_group(s_, id, context_tokens, token_budget, info ? info : &local));
  }
  Error Park(uint64_t id) { return Error::From(hs_park(s_, id)); }
  Error Resume(uint64_t id, hs_request_info* info = nullptr) {
    hs_request_info local = HS_REQUEST_INFO_INIT;
    return Error::From(hs_resume(s_, id, info ? info : &local));
  }
  Error RecordPtr(uint64_t id, uint32_t layer, uint32_t position, void** out) {
    return Error::From(hs_record_ptr(s_, id, layer, position, out));
  }
  Error Info(hs_session_info* out) {
    *out = HS_SESSION_INFO_INIT;
    return Error::From(hs_session_get_info(s_, out));
  }
  Error Timings(hs_session_timings* out) {
    *out = HS_SESSION_TIMINGS_INIT;
    return Error::From(hs_session_get_timings(s_, out));
  }
  Error Stats(hs_stats* out) {
    *out = HS_STATS_INIT;
    return Error::From(hs_stats_get(s_, out));
  }
  Error Resolve(const hs_resolve_args& args) { return Error::From(hs_resolve(s_, &args)); }
  Error Prewarm(const hs_prewarm_args& args) { return Error::From(hs_prewarm(s_, &args)); }

 private:
  explicit Session(hs_session* s) : s_(s) {}
  hs_session* s_ = nullptr;
};

}  // namespace hisparse

#endif  // HISPARSE_HISPARSE_HPP_
