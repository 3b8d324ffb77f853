// The C ABI's calls on one request (hisparse.h): admit (hs_admit2, and the older admit calls as
// wrappers that fill an hs_admit_args), extend, release, park and resume, imports, and the lease,
// listing and adoption of durable requests.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "c_api_internal.h"
#include "client_session.h"
#include "hisparse/hisparse.h"

using hisparse::ClientSession;
using hisparse::c_api::Fail;
using hisparse::c_api::Guard;
using hisparse::c_api::kAdmitArgsV1;
using hisparse::c_api::kRequestInfoV1;
using hisparse::c_api::ReadSized;
using hisparse::c_api::SizeOk;
using hisparse::c_api::ToResult;
using hisparse::c_api::WriteSized;

namespace {

// A call that answers an hs_request_info: checks `s` and `out` (which may be NULL), runs `call` on
// the session (absl::StatusOr<hs_request_info>(ClientSession&)) and writes its answer to `out`.
template <typename Call>
hs_result RequestInfoCall(hs_session* s, hs_request_info* out, Call&& call) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    if (out != nullptr && !SizeOk(out->struct_size, kRequestInfoV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_request_info.struct_size is too small: use HS_REQUEST_INFO_INIT");
    }
    absl::StatusOr<hs_request_info> r = call(*s->Get());
    if (!r.ok()) return ToResult(r.status());
    if (out != nullptr) WriteSized(*r, out);
    return HS_OK;
  });
}

// The hs_admit_args of the older calls: these fields set, every other zero.
hs_admit_args ArgsOf(uint64_t request_id, uint32_t context_tokens, uint32_t token_budget) {
  hs_admit_args a = HS_ADMIT_ARGS_INIT;
  a.request_id = request_id;
  a.context_tokens = context_tokens;
  a.token_budget = token_budget;
  return a;
}

// hs_admit2's body, the path of every single admission: `a` as this library knows it.
hs_result Admit(hs_session* s, const hs_admit_args& a, hs_request_info* out) {
  return RequestInfoCall(s, out, [&](ClientSession& c) { return c.Admit(a); });
}

}  // namespace

extern "C" {

hs_result hs_admit2(hs_session* s, const hs_admit_args* args, hs_request_info* out) {
  return Guard([&] {
    if (args == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "args is NULL");
    if (!SizeOk(args->struct_size, kAdmitArgsV1)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "hs_admit_args.struct_size is too small: use HS_ADMIT_ARGS_INIT");
    }
    return Admit(s, ReadSized(*args), out);
  });
}

hs_result hs_admit(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                   hs_request_info* out) {
  return Admit(s, ArgsOf(request_id, context_tokens, token_budget), out);
}

hs_result hs_extend(hs_session* s, uint64_t request_id, uint32_t token_budget, hs_request_info* out) {
  return RequestInfoCall(s, out, [&](ClientSession& c) { return c.Extend(request_id, token_budget); });
}

hs_result hs_release(hs_session* s, uint64_t request_id) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->Get()->Release(request_id));
  });
}

hs_result hs_admit_shared(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                          uint64_t parent_request_id, uint32_t prefix_tokens, hs_request_info* out) {
  hs_admit_args a = ArgsOf(request_id, context_tokens, token_budget);
  a.parent_request_id = parent_request_id;
  a.prefix_tokens = prefix_tokens;
  return Admit(s, a, out);
}

hs_result hs_admit_group(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                         hs_request_info* out) {
  hs_admit_args a = ArgsOf(request_id, context_tokens, token_budget);
  a.flags = HS_ADMIT_GROUP;
  return Admit(s, a, out);
}

hs_result hs_park(hs_session* s, uint64_t request_id) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->Get()->Park(request_id));
  });
}

hs_result hs_resume(hs_session* s, uint64_t request_id, hs_request_info* out) {
  return RequestInfoCall(s, out, [&](ClientSession& c) { return c.Resume(request_id); });
}

// ---- Imports (ABI 1.6) ----

hs_result hs_admit_import(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget) {
  hs_admit_args a = ArgsOf(request_id, context_tokens, token_budget);
  a.flags = HS_ADMIT_IMPORT;
  return Admit(s, a, nullptr);
}

hs_result hs_import_grant(hs_session* s, uint64_t request_id, void* buf, size_t capacity, size_t* grant_bytes) {
  return Guard([&] {
    if (s == nullptr || grant_bytes == nullptr || (buf == nullptr && capacity > 0)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and grant_bytes must not be NULL, nor buf when capacity > 0");
    }
    auto grant = s->Get()->ImportGrant(request_id);
    if (!grant.ok()) return ToResult(grant.status());
    *grant_bytes = grant->size();
    if (capacity < grant->size()) {
      return Fail(HS_ERR_RESOURCE_EXHAUSTED, "the grant does not fit: capacity is smaller than *grant_bytes");
    }
    std::memcpy(buf, grant->data(), grant->size());
    return HS_OK;
  });
}

hs_result hs_await_import(hs_session* s, uint64_t request_id, uint32_t timeout_ms, hs_request_info* out) {
  return RequestInfoCall(s, out, [&](ClientSession& c) { return c.AwaitImport(request_id, timeout_ms); });
}

// ---- Durable requests (ABI 1.7) ----

hs_result hs_admit_durable(hs_session* s, uint64_t request_id, uint32_t context_tokens, uint32_t token_budget,
                           uint32_t lease_seconds, hs_request_info* out) {
  hs_admit_args a = ArgsOf(request_id, context_tokens, token_budget);
  a.lease_seconds = lease_seconds;
  return Admit(s, a, out);
}

hs_result hs_set_lease(hs_session* s, uint64_t request_id, uint32_t lease_seconds) {
  return Guard([&] {
    if (s == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session is NULL");
    return ToResult(s->Get()->SetLease(request_id, lease_seconds).status());
  });
}

hs_result hs_list_adoptable(hs_session* s, uint64_t* dead_session_ids, uint64_t* request_ids,
                            double* lease_seconds_left, size_t capacity, size_t* count) {
  return Guard([&] {
    if (s == nullptr || count == nullptr) return Fail(HS_ERR_INVALID_ARGUMENT, "session and count must not be NULL");
    auto listed = s->Get()->ListAdoptable();
    if (!listed.ok()) return ToResult(listed.status());
    *count = listed->size();
    for (size_t i = 0; i < listed->size() && i < capacity; ++i) {
      if (dead_session_ids != nullptr) dead_session_ids[i] = (*listed)[i].dead_session_id();
      if (request_ids != nullptr) request_ids[i] = (*listed)[i].request_id();
      if (lease_seconds_left != nullptr) lease_seconds_left[i] = (*listed)[i].lease_seconds_left();
    }
    if (capacity < listed->size()) {
      return Fail(HS_ERR_RESOURCE_EXHAUSTED, "more adoptable requests than capacity: see *count");
    }
    return HS_OK;
  });
}

hs_result hs_adopt(hs_session* s, uint64_t dead_session_id, uint64_t* out_request_ids, size_t capacity, size_t* count) {
  return Guard([&] {
    if (s == nullptr || count == nullptr || (out_request_ids == nullptr && capacity > 0)) {
      return Fail(HS_ERR_INVALID_ARGUMENT, "session and count must not be NULL, nor out_request_ids when capacity > 0");
    }
    auto ids = s->Get()->Adopt(dead_session_id);
    if (!ids.ok()) return ToResult(ids.status());
    *count = ids->size();
    for (size_t i = 0; i < ids->size() && i < capacity; ++i) out_request_ids[i] = (*ids)[i];
    return HS_OK;
  });
}

}  // extern "C"
