#include "hisparse/common/mutex_mode.h"

#include "absl/synchronization/mutex.h"

// Sanitizer builds keep the check (they build with NDEBUG too, for speed).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HISPARSE_KEEP_DEADLOCK_CHECK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HISPARSE_KEEP_DEADLOCK_CHECK 1
#endif
#endif

namespace hisparse {

void UseReleaseMutexMode() {
#if defined(NDEBUG) && !defined(HISPARSE_KEEP_DEADLOCK_CHECK)
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace hisparse
