// Compiled, never linked, by check_analysis.sh: with HISPARSE_TSA_CORRECT the accesses below hold
// the lock and the file must compile cleanly under the build's thread-safety flags; without it
// each access is a violation that those flags must turn into an error. Together they show that a
// clang build enforces the ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations.
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace {

class Counter {
 public:
  void Add(uint64_t n) ABSL_LOCKS_EXCLUDED(mu_) {
#ifdef HISPARSE_TSA_CORRECT
    absl::MutexLock lock(&mu_);
#endif
    AddLocked(n);  // violation without the lock: AddLocked requires mu_
  }
  uint64_t value() const ABSL_LOCKS_EXCLUDED(mu_) {
#ifdef HISPARSE_TSA_CORRECT
    absl::MutexLock lock(&mu_);
#endif
    return value_;  // violation without the lock: value_ is guarded by mu_
  }

 private:
  void AddLocked(uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { value_ += n; }

  mutable absl::Mutex mu_;
  uint64_t value_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

uint64_t HisparseThreadSafetyProbe() {
  Counter c;
  c.Add(1);
  return c.value();
}
