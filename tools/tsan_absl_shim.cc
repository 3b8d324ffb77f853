// libhisparse_tsan_absl.so: lets ThreadSanitizer see absl::Mutex in TSan builds
// (HISPARSE_SANITIZE=thread; tools/ci-sanitizers.sh).
//
// Why: Debian's Abseil is a prebuilt shared library without TSan instrumentation. absl::Mutex
// locks with atomics and futexes inside it, which TSan cannot observe, so every field that a
// Mutex guards (all of SessionManager's state) looks like a data race between the threads that
// take it in turn. Measured: a two-thread counter under absl::MutexLock is reported at once.
//
// How: the top-level CMakeLists.txt links this library first into every target of a TSan build.
// Being loaded before libabsl_synchronization.so, its definitions of the Mutex, CondVar and
// Notification entry points below take precedence for every caller (our code, gRPC, Abseil
// itself); each forwards to Abseil's own (dlsym RTLD_NEXT) and tells TSan the happens-before edge
// the call creates: acquire after a lock, release before an unlock. That is all TSan needs to
// stop reporting guarded accesses; it gets no lock-order (deadlock) checking from this.
//
// Built without -fsanitize=thread itself: it holds no data of its own beyond the resolved
// function pointers, and the TSan entry points come from the executable's runtime (weak, so a
// process without TSan could load it harmlessly).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

extern "C" {
void __tsan_acquire(void* addr) __attribute__((weak));
void __tsan_release(void* addr) __attribute__((weak));
}

namespace {

void Acquire(const void* addr) {
  if (__tsan_acquire != nullptr) __tsan_acquire(const_cast<void*>(addr));
}
void Release(const void* addr) {
  if (__tsan_release != nullptr) __tsan_release(const_cast<void*>(addr));
}

#define HS_STRINGIFY_INNER(x) #x
#define HS_STRINGIFY(x) HS_STRINGIFY_INNER(x)

// Abseil's definition of `absl::<ns>::<rest>`, where `rest` is the Itanium mangling after the
// namespace (e.g. "5Mutex4LockEv"). The inline namespace ("debian3" on Debian 12) comes from
// Abseil's own options header, so the shim follows the installed version.
void* Next(const char* rest) {
  const std::string ns = HS_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = "_ZN4absl" + std::to_string(ns.size()) + ns + rest;
  void* fn = ::dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_shim: %s not found after this library\n", name.c_str());
    std::abort();
  }
  return fn;
}

// Resolved once per entry point; a static local's initialization is thread-safe.
#define HS_REAL(type, rest) static const auto real = reinterpret_cast<type>(Next(rest))

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  HS_REAL(void (*)(Mutex*), "5Mutex4LockEv");
  real(this);
  Acquire(this);
}
void Mutex::Unlock() {
  HS_REAL(void (*)(Mutex*), "5Mutex6UnlockEv");
  Release(this);
  real(this);
}
void Mutex::ReaderLock() {
  HS_REAL(void (*)(Mutex*), "5Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}
void Mutex::ReaderUnlock() {
  HS_REAL(void (*)(Mutex*), "5Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}
bool Mutex::TryLock() {
  HS_REAL(bool (*)(Mutex*), "5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  HS_REAL(bool (*)(Mutex*), "5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}
// A condition handed to LockWhen or Await is evaluated by Abseil while the mutex is held, but
// inside the library: by the waiter after it re-takes the lock, or by whichever thread unlocks,
// and a false one is followed by an unlock TSan cannot see either. So the condition's reads of
// guarded fields raced with the writes of the next thread to take the lock. The wrapper brackets
// each evaluation with the acquire and the release of the lock it runs under.
struct AnnotatedCondition {
  const Condition* cond;
  const Mutex* mu;
};
bool EvalAnnotated(AnnotatedCondition* a) {
  Acquire(a->mu);
  const bool holds = a->cond->Eval();
  Release(a->mu);
  return holds;
}

void Mutex::LockWhen(const Condition& cond) {
  HS_REAL(void (*)(Mutex*, const Condition&), "5Mutex8LockWhenERKNS0_9ConditionE");
  AnnotatedCondition a{&cond, this};
  real(this, Condition(&EvalAnnotated, &a));
  Acquire(this);
}
// Await and CondVar::Wait release the mutex while they wait and hold it again on return.
void Mutex::Await(const Condition& cond) {
  HS_REAL(void (*)(Mutex*, const Condition&), "5Mutex5AwaitERKNS0_9ConditionE");
  AnnotatedCondition a{&cond, this};
  Release(this);
  real(this, Condition(&EvalAnnotated, &a));
  Acquire(this);
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  HS_REAL(bool (*)(Mutex*, const Condition&, Time), "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition a{&cond, this};
  Release(this);
  const bool holds = real(this, Condition(&EvalAnnotated, &a), deadline);
  Acquire(this);
  return holds;
}
// Through the wrapper above (the library's own AwaitWithTimeout would call its AwaitWithDeadline
// directly, unannotated).
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  return AwaitWithDeadline(cond, Now() + timeout);
}
void CondVar::Wait(Mutex* mu) {
  HS_REAL(void (*)(CondVar*, Mutex*), "7CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  HS_REAL(bool (*)(CondVar*, Mutex*, Duration), "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool timed_out = real(this, mu, timeout);
  Acquire(mu);
  return timed_out;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  HS_REAL(bool (*)(CondVar*, Mutex*, Time), "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool timed_out = real(this, mu, deadline);
  Acquire(mu);
  return timed_out;
}
void Notification::Notify() {
  HS_REAL(void (*)(Notification*), "12Notification6NotifyEv");
  Release(this);
  real(this);
}
void Notification::WaitForNotification() const {
  // A const member: mangled with K after N.
  static const auto real = reinterpret_cast<void (*)(const Notification*)>([] {
    const std::string ns = HS_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
    const std::string name = "_ZNK4absl" + std::to_string(ns.size()) + ns + "12Notification19WaitForNotificationEv";
    void* fn = ::dlsym(RTLD_NEXT, name.c_str());
    if (fn == nullptr) std::abort();
    return fn;
  }());
  real(this);
  Acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl
