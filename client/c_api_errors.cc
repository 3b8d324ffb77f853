// The C ABI's errors and versions (hisparse.h): hs_result_string, hs_last_error and the version
// calls, and the one place an absl::Status becomes an hs_result and hs_last_error()'s message.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "c_api_internal.h"
#include "hisparse/common/version.h"
#include "hisparse/hisparse.h"

namespace hisparse {
namespace c_api {
namespace {

thread_local std::string g_last_error;

}  // namespace

hs_result CodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return HS_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return HS_ERR_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound:
      return HS_ERR_NOT_FOUND;
    case absl::StatusCode::kAlreadyExists:
      return HS_ERR_ALREADY_EXISTS;
    case absl::StatusCode::kResourceExhausted:
      return HS_ERR_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return HS_ERR_PERMISSION_DENIED;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return HS_ERR_FAILED_PRECONDITION;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return HS_ERR_UNAVAILABLE;
    case absl::StatusCode::kUnimplemented:
      return HS_ERR_UNIMPLEMENTED;
    default:
      return HS_ERR_INTERNAL;
  }
}

void SetLastError(absl::string_view message) { g_last_error.assign(message.data(), message.size()); }

hs_result Fail(hs_result r, const char* msg) {
  g_last_error = msg;
  return r;
}

}  // namespace c_api
}  // namespace hisparse

extern "C" {

const char* hs_result_string(hs_result r) {
  switch (r) {
    case HS_OK:
      return "ok";
    case HS_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case HS_ERR_NOT_FOUND:
      return "not found";
    case HS_ERR_ALREADY_EXISTS:
      return "already exists";
    case HS_ERR_RESOURCE_EXHAUSTED:
      return "resource exhausted";
    case HS_ERR_PERMISSION_DENIED:
      return "permission denied";
    case HS_ERR_FAILED_PRECONDITION:
      return "failed precondition";
    case HS_ERR_UNAVAILABLE:
      return "unavailable";
    case HS_ERR_UNIMPLEMENTED:
      return "unimplemented";
    case HS_ERR_INTERNAL:
      return "internal error";
    case HS_ERR_ABORTED:
      return "aborted (another item of the batch failed)";
  }
  return "unknown hs_result";
}

const char* hs_last_error(void) { return hisparse::c_api::g_last_error.c_str(); }
int hs_abi_version(void) { return HS_ABI_VERSION; }
void hs_abi_version_get(int* major, int* minor) {
  if (major != nullptr) *major = HS_ABI_VERSION_MAJOR;
  if (minor != nullptr) *minor = HS_ABI_VERSION_MINOR;
}
const char* hs_version(void) { return HISPARSE_VERSION; }

}  // extern "C"
