// hisparse-keeper-probe: the child keeper_test runs under a real hisparse-keeper. It stands in for
// hisparsed's use of the fd store (hisparse/common/fd_store.h) and reports what it sees, one line
// per event on stdout (the test reads them from a pipe):
//   start pid=P names=N1:N2 open=K notify=PATH   at each start: $LISTEN_FDNAMES as received, and
//                                                 how many descriptors above 2 it found open
//   put slab-1 | pattern ok | removed | ready pid=P | hup | term | error TEXT
// Modes (argv[1]):
//   kill-once [nobarrier]  no slab-1 passed: store a memfd holding a pattern as slab-1 (then
//                          BARRIER=1 unless nobarrier) and SIGKILL itself; slab-1 passed: check
//                          the pattern, remove it, exit 0.
//   serve                  check slab-1's pattern when passed, else store it; then report ready
//                          and wait: SIGHUP reports hup, SIGTERM reports term and exits 0.
//   crash STATUS           exits STATUS at once.
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hisparse/common/fd_store.h"
#include "hisparse/common/unique_fd.h"

namespace {

constexpr size_t kPatternBytes = 64 << 10;
constexpr char kSlab[] = "slab-1";

void Report(const std::string& line) {
  const std::string s = line + "\n";
  if (::write(STDOUT_FILENO, s.data(), s.size()) != static_cast<ssize_t>(s.size())) ::_exit(3);
}

[[noreturn]] void Die(const std::string& what) {
  Report("error " + what);
  ::_exit(2);
}

uint8_t PatternByte(size_t i) { return static_cast<uint8_t>((i * 131 + 7) & 0xff); }

// Descriptors above 2 open now: the keeper's child must hold its stored ones and nothing else.
int OpenAboveStdio() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) Die("opendir /proc/self/fd");
  int count = 0;
  while (const dirent* e = ::readdir(d)) {
    int fd = -1;
    if (absl::SimpleAtoi(e->d_name, &fd) && fd > 2 && fd != ::dirfd(d)) ++count;
  }
  ::closedir(d);
  return count;
}

std::unique_ptr<hisparse::FdStore> Store() {
  auto store = hisparse::FdStore::FromEnvironment();
  if (!store.ok()) Die(std::string(store.status().message()));
  return *std::move(store);
}

void PutSlab(bool barrier) {
  auto fd = hisparse::CreateMemfd("probe-slab", kPatternBytes, /*try_hugetlb=*/false, nullptr);
  if (!fd.ok()) Die(std::string(fd.status().message()));
  std::vector<uint8_t> bytes(kPatternBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = PatternByte(i);
  if (::pwrite(fd->get(), bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) Die("pwrite");
  auto store = Store();
  if (absl::Status st = store->Put(kSlab, fd->get()); !st.ok()) Die(std::string(st.message()));
  if (barrier) {
    if (absl::Status st = store->Barrier(absl::Seconds(60)); !st.ok()) Die(std::string(st.message()));
  }
  Report("put slab-1");
}

void CheckPattern(int fd) {
  std::vector<uint8_t> bytes(kPatternBytes);
  if (::pread(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) Die("pread of slab-1");
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != PatternByte(i)) Die(absl::StrCat("slab-1 differs at byte ", i));
  }
  Report("pattern ok");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  // Blocked before anything else, so that a SIGTERM that comes early is still reported.
  sigset_t waited;
  sigemptyset(&waited);
  sigaddset(&waited, SIGTERM);
  sigaddset(&waited, SIGHUP);
  if (mode == "serve") ::sigprocmask(SIG_BLOCK, &waited, nullptr);

  const char* names = std::getenv("LISTEN_FDNAMES");
  const char* notify = std::getenv("NOTIFY_SOCKET");
  Report(absl::StrCat("start pid=", ::getpid(), " names=", names != nullptr ? names : "", " open=", OpenAboveStdio(),
                      " notify=", notify != nullptr ? notify : ""));
  if (mode == "crash") {
    int status = 1;
    if (argc < 3 || !absl::SimpleAtoi(argv[2], &status)) Die("crash wants an exit status");
    return status;
  }
  auto taken = hisparse::TakeListenFds();
  if (!taken.ok()) Die(std::string(taken.status().message()));
  if (std::getenv("LISTEN_FDS") != nullptr) Die("LISTEN_FDS still set after TakeListenFds");
  int slab = -1;
  for (const hisparse::ListenFd& f : *taken) {
    if (f.name == kSlab) slab = f.fd.get();
  }

  if (mode == "kill-once") {
    if (slab < 0) {
      PutSlab(/*barrier=*/argc < 3 || std::string(argv[2]) != "nobarrier");
      ::kill(::getpid(), SIGKILL);
      Die("still alive after SIGKILL");
    }
    CheckPattern(slab);
    auto store = Store();
    if (absl::Status st = store->Remove(kSlab); !st.ok()) Die(std::string(st.message()));
    if (absl::Status st = store->Barrier(absl::Seconds(60)); !st.ok()) Die(std::string(st.message()));
    Report("removed");
    return 0;
  }
  if (mode == "serve") {
    if (slab < 0) {
      PutSlab(/*barrier=*/true);
    } else {
      CheckPattern(slab);
    }
    Report(absl::StrCat("ready pid=", ::getpid()));
    while (true) {
      int sig = 0;
      if (::sigwait(&waited, &sig) != 0) Die("sigwait");
      if (sig == SIGHUP) Report("hup");
      if (sig == SIGTERM) {
        Report("term");
        return 0;
      }
    }
  }
  Die("unknown mode " + mode);
}
