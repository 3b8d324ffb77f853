// StartImportTarget for a daemon built without UCX (libucx-dev): imports are off.
#include "absl/status/status.h"
#include "hisparse/daemon/import_target.h"

namespace hisparse {

absl::StatusOr<std::unique_ptr<ImportTarget>> StartImportTarget(const ImportTargetOptions& /*options*/) {
  return absl::UnimplementedError("this daemon was built without UCX (libucx-dev): imports are off");
}

}  // namespace hisparse
