// ThreadSanitizer annotations for Debian's prebuilt Abseil synchronization (ZERO_SANITIZE=thread only: the top
// CMakeLists.txt links this file into every executable of that build; docs/internals/sanitizers.md).
//
// Debian's libabsl_synchronization.so is not instrumented. absl::Mutex locks with an atomic compare-and-swap and
// waits on a futex, both inside that library, so TSan sees no synchronization at all: every field zero guards
// with an absl::Mutex (Work's state, the ordered executor's queue, the stores) would be reported as a race between
// the threads that take turns under it. An Abseil built with -fsanitize=thread tells TSan about its locks itself
// (mutex.cc calls the __tsan_mutex_* annotations around each operation); this file does the same from outside:
// it defines the exported Mutex, CondVar, Notification, BlockingCounter and Barrier entry points in the
// executable, where they take precedence over the library's, annotates each call the way Abseil's own TSan build
// does, and calls the library's function (found with dlsym(RTLD_NEXT)) to do the work. Nothing is suppressed: a
// field accessed without the lock is still reported; TSan also checks lock order (deadlocks) on these mutexes.
//
// What TSan still does not see: memory accesses inside a lock operation are ignored (as in Abseil's TSan build),
// and that is where absl::Condition predicates run, so a predicate's own reads are not checked (Abseil's build
// checks them through a finer annotation dance inside mutex.cc, which cannot be done from outside). The inline
// Notification::HasBeenNotified() reads an atomic the library wrote, so it gives no happens-before edge; zero's
// tests wait with WaitForNotification*, which this file annotates.
//
// Abseil's own deadlock detector is switched off here (below): Debian's library is built in debug mode, where
// every lock and ~Mutex updates a lock-order graph under an internal spin lock whose atomics TSan cannot see, so
// TSan reported the graph's bookkeeping (GraphCycles::RemoveNode's memmove) as a race. TSan checks the same lock
// order itself, on the annotations above (lock-order-inversion reports), so nothing is lost.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if !defined(__SANITIZE_THREAD__)
#error "tests/support/tsan_absl_sync.cc belongs to the ZERO_SANITIZE=thread build only"
#endif

namespace {

#define ZERO_TSAN_STR2(x) #x
#define ZERO_TSAN_STR(x) ZERO_TSAN_STR2(x)

// The library's definition of absl::<inline namespace>::<rest>, by its Itanium-mangled name: `qualifier` is "N"
// or "NK" (a const member function), `rest` the mangled name after the namespace (substitutions of the namespace
// inside it are written S_/NS0_, independent of its name).
template <typename F>
F Real(const char* qualifier, const char* rest) {
  std::string name = std::string("_Z") + qualifier + "4absl";
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const char* ns = ZERO_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  name += std::to_string(std::strlen(ns)) + ns;
#endif
  name += rest;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in the Abseil libraries (%s)\n", name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

// Each wrapper looks its target up once (a function-local static: thread-safe, and TSan understands it).
#define ZERO_TSAN_REAL(type, qualifier, rest) static const auto real = Real<type>(qualifier, rest)

// Abseil's functions call one another through the dynamic linker, so they land here too (AwaitWithTimeout calls
// AwaitWithDeadline, Notification::Notify locks its mutex): only a thread's outermost call is annotated, as in
// Abseil's TSan build, where the inner ones are internal functions without annotations.
thread_local int tls_depth = 0;
struct Nesting {
  Nesting() : inner(tls_depth++ > 0) {}
  ~Nesting() { --tls_depth; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;
  const bool inner;
};

// Mutexes this thread holds in reader mode, so that Await and CondVar::Wait annotate the mode they release and
// re-acquire in (Abseil reads it from the mutex word; its layout is private). A thread holds few at once.
thread_local const void* tls_reader_held[16];
thread_local int tls_reader_count = 0;

void NoteReaderLocked(const void* mu) {
  if (tls_reader_count < 16) tls_reader_held[tls_reader_count++] = mu;
}
void NoteReaderUnlocked(const void* mu) {
  for (int i = tls_reader_count - 1; i >= 0; --i) {
    if (tls_reader_held[i] == mu) {
      tls_reader_held[i] = tls_reader_held[--tls_reader_count];
      return;
    }
  }
}
unsigned HeldFlags(const void* mu) {
  for (int i = 0; i < tls_reader_count; ++i) {
    if (tls_reader_held[i] == mu) return __tsan_mutex_read_lock;
  }
  return 0;
}

// A lock operation: TSan ignores the accesses in between and acquires at the end.
template <typename Op>
auto Locking(void* mu, unsigned flags, Op op) {
  __tsan_mutex_pre_lock(mu, flags);
  auto r = op();
  __tsan_mutex_post_lock(mu, flags, 0);
  return r;
}

// A wait that releases a held mutex and holds it again when it returns (Await, CondVar::Wait).
template <typename Op>
auto Waiting(void* mu, Op op) {
  const unsigned flags = HeldFlags(mu);
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
  return Locking(mu, flags, op);
}

// Before main: Abseil's deadlock detector off, TSan's on (see the top of this file).
const bool kAbslDeadlockDetectionOff = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// ---- Mutex ----
Mutex::~Mutex() {  // at any depth: TSan forgets the mutex (an unknown one is ignored)
  ZERO_TSAN_REAL(void (*)(Mutex*), "N", "5MutexD1Ev");
  __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  ZERO_TSAN_REAL(void (*)(Mutex*), "N", "5Mutex4LockEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  Locking(this, 0, [&] { return (real(this), 0); });
}

void Mutex::ReaderLock() {
  ZERO_TSAN_REAL(void (*)(Mutex*), "N", "5Mutex10ReaderLockEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  Locking(this, __tsan_mutex_read_lock, [&] { return (real(this), 0); });
  NoteReaderLocked(this);
}

bool Mutex::TryLock() {
  ZERO_TSAN_REAL(bool (*)(Mutex*), "N", "5Mutex7TryLockEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_try_lock | (ok ? 0 : __tsan_mutex_try_lock_failed), 0);
  return ok;
}

bool Mutex::ReaderTryLock() {
  ZERO_TSAN_REAL(bool (*)(Mutex*), "N", "5Mutex13ReaderTryLockEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_read_lock);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this, ok ? __tsan_mutex_try_read_lock : __tsan_mutex_try_read_lock_failed, 0);
  if (ok) NoteReaderLocked(this);
  return ok;
}

void Mutex::Unlock() {
  ZERO_TSAN_REAL(void (*)(Mutex*), "N", "5Mutex6UnlockEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  ZERO_TSAN_REAL(void (*)(Mutex*), "N", "5Mutex12ReaderUnlockEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  NoteReaderUnlocked(this);
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

void Mutex::LockWhen(const Condition& cond) {
  ZERO_TSAN_REAL(void (*)(Mutex*, const Condition&), "N", "5Mutex8LockWhenERKNS0_9ConditionE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond);
  Locking(this, 0, [&] { return (real(this, cond), 0); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  ZERO_TSAN_REAL(bool (*)(Mutex*, const Condition&, Duration), "N",
                 "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond, timeout);
  return Locking(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  ZERO_TSAN_REAL(bool (*)(Mutex*, const Condition&, Time), "N",
                 "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond, deadline);
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  ZERO_TSAN_REAL(void (*)(Mutex*, const Condition&), "N", "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond);
  Locking(this, __tsan_mutex_read_lock, [&] { return (real(this, cond), 0); });
  NoteReaderLocked(this);
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  ZERO_TSAN_REAL(bool (*)(Mutex*, const Condition&, Duration), "N",
                 "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond, timeout);
  const bool r = Locking(this, __tsan_mutex_read_lock, [&] { return real(this, cond, timeout); });
  NoteReaderLocked(this);  // held whether or not the condition became true
  return r;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  ZERO_TSAN_REAL(bool (*)(Mutex*, const Condition&, Time), "N",
                 "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond, deadline);
  const bool r = Locking(this, __tsan_mutex_read_lock, [&] { return real(this, cond, deadline); });
  NoteReaderLocked(this);
  return r;
}

void Mutex::Await(const Condition& cond) {
  ZERO_TSAN_REAL(void (*)(Mutex*, const Condition&), "N", "5Mutex5AwaitERKNS0_9ConditionE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond);
  Waiting(this, [&] { return (real(this, cond), 0); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  ZERO_TSAN_REAL(bool (*)(Mutex*, const Condition&, Duration), "N",
                 "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond, timeout);
  return Waiting(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  ZERO_TSAN_REAL(bool (*)(Mutex*, const Condition&, Time), "N",
                 "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Nesting nesting;
  if (nesting.inner) return real(this, cond, deadline);
  return Waiting(this, [&] { return real(this, cond, deadline); });
}

// ---- CondVar: waits release and re-acquire the mutex; Signal needs nothing (the mutex orders the data) ----
void CondVar::Wait(Mutex* mu) {
  ZERO_TSAN_REAL(void (*)(CondVar*, Mutex*), "N", "7CondVar4WaitEPNS0_5MutexE");
  Nesting nesting;
  if (nesting.inner) return real(this, mu);
  Waiting(mu, [&] { return (real(this, mu), 0); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  ZERO_TSAN_REAL(bool (*)(CondVar*, Mutex*, Duration), "N", "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Nesting nesting;
  if (nesting.inner) return real(this, mu, timeout);
  return Waiting(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  ZERO_TSAN_REAL(bool (*)(CondVar*, Mutex*, Time), "N", "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Nesting nesting;
  if (nesting.inner) return real(this, mu, deadline);
  return Waiting(mu, [&] { return real(this, mu, deadline); });
}

// ---- Notification, BlockingCounter, Barrier: a release before the signalling call, an acquire after a wait
// that saw it (their fast paths read an atomic inside the library, which TSan does not see) ----
void Notification::Notify() {
  ZERO_TSAN_REAL(void (*)(Notification*), "N", "12Notification6NotifyEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  ZERO_TSAN_REAL(void (*)(const Notification*), "NK", "12Notification19WaitForNotificationEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  ZERO_TSAN_REAL(bool (*)(const Notification*, Duration), "NK",
                 "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  Nesting nesting;
  if (nesting.inner) return real(this, timeout);
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  ZERO_TSAN_REAL(bool (*)(const Notification*, Time), "NK",
                 "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  Nesting nesting;
  if (nesting.inner) return real(this, deadline);
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool BlockingCounter::DecrementCount() {
  ZERO_TSAN_REAL(bool (*)(BlockingCounter*), "N", "15BlockingCounter14DecrementCountEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  __tsan_release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  ZERO_TSAN_REAL(void (*)(BlockingCounter*), "N", "15BlockingCounter4WaitEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  real(this);
  __tsan_acquire(this);
}

bool Barrier::Block() {
  ZERO_TSAN_REAL(bool (*)(Barrier*), "N", "7Barrier5BlockEv");
  Nesting nesting;
  if (nesting.inner) return real(this);
  __tsan_release(this);
  const bool last = real(this);
  __tsan_acquire(this);
  return last;
}

ABSL_NAMESPACE_END
}  // namespace absl
