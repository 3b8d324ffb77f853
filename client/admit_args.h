// The checks of hs_admit_args (hisparse.h) that need no daemon: the combinations of options no
// admission can serve, and what the daemon's batch cannot carry. Both name the fields at fault,
// as hs_last_error() shows them to the caller. Pure functions.
#ifndef HISPARSE_CLIENT_ADMIT_ARGS_H_
#define HISPARSE_CLIENT_ADMIT_ARGS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "hisparse/hisparse.h"

namespace hisparse {

// InvalidArgument naming the fields for: unknown flag bits; a parent without prefix_tokens or
// prefix_tokens without a parent; HS_ADMIT_GROUP with a parent, lease_seconds or HS_ADMIT_IMPORT;
// HS_ADMIT_IMPORT with a parent or lease_seconds. Everything else is the daemon's to judge.
absl::Status CheckAdmitArgs(const hs_admit_args& args);

// CheckAdmitArgs for item `index` of a batch, and InvalidArgument for a shared prefix or
// HS_ADMIT_GROUP, which the daemon's AdmitBatch does not serve. The message names items[index].
absl::Status CheckBatchAdmitArgs(const hs_admit_args& args, size_t index);

}  // namespace hisparse

#endif  // HISPARSE_CLIENT_ADMIT_ARGS_H_
