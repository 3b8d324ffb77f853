// Abseil's Mutex deadlock check, off in release builds.
//
// Debian builds Abseil without NDEBUG, so its Mutex checks every acquisition for lock-order cycles
// (absl::SetMutexDeadlockDetectionMode): a walk of one process-wide graph under one process-wide
// spin lock, which serializes every lock and unlock of every thread of the process. The control
// lanes showed it: 64 lanes of 64 engine sessions answering each from its own thread. Our release
// builds (NDEBUG) turn it off; debug and sanitizer (ASan, TSan) builds keep it, and -Wthread-safety
// checks the locking we declare at compile time either way.
#ifndef HISPARSE_COMMON_MUTEX_MODE_H_
#define HISPARSE_COMMON_MUTEX_MODE_H_

namespace hisparse {

// Idempotent and thread-safe; a no-op in builds without NDEBUG and in sanitizer builds. The daemon calls it first
// thing; the client library when it opens its first session (its own copy of Abseil, in the wheel's self-contained
// library).
void UseReleaseMutexMode();

}  // namespace hisparse

#endif  // HISPARSE_COMMON_MUTEX_MODE_H_
