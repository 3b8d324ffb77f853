// FdStore against a socket of the test's own standing in for the service manager, and
// TakeListenFds in forked children (it takes descriptors 3.. and changes the environment).
#include "hisparse/common/fd_store.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace fd_store_test {

using ::testing::HasSubstr;

// A datagram socket bound where the manager's would be, with its credentials on (as systemd's).
class FakeManager {
 public:
  // At a path in a fresh directory; or, with `abstract_name`, at "\0" + that name.
  explicit FakeManager(const std::string& abstract_name = "") {
    sock_.Reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    socklen_t len;
    if (abstract_name.empty()) {
      char tmpl[] = "/tmp/hs-fd-store-XXXXXX";
      EXPECT_NE(::mkdtemp(tmpl), nullptr);
      dir_ = tmpl;
      address_ = dir_ + "/notify";
      std::memcpy(addr.sun_path, address_.data(), address_.size());
      len = sizeof(addr);
    } else {
      address_ = "@" + abstract_name;
      std::memcpy(addr.sun_path + 1, abstract_name.data(), abstract_name.size());
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + abstract_name.size());
    }
    EXPECT_EQ(::bind(sock_.get(), reinterpret_cast<const sockaddr*>(&addr), len), 0) << std::strerror(errno);
    const int on = 1;
    EXPECT_EQ(::setsockopt(sock_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)), 0);
    const timeval wait{60, 0};  // a test that waits for a message that never comes fails, not hangs
    EXPECT_EQ(::setsockopt(sock_.get(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait)), 0);
  }
  ~FakeManager() {
    sock_.Reset();
    if (!dir_.empty()) {
      ::unlink(address_.c_str());
      ::rmdir(dir_.c_str());
    }
  }
  const std::string& address() const { return address_; }

  struct Message {
    std::string payload;
    std::vector<UniqueFd> fds;
    pid_t sender = 0;
  };
  Message Receive() {
    Message m;
    char buf[4096];
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * 8)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(sock_.get(), &msg, MSG_CMSG_CLOEXEC);
    EXPECT_GE(n, 0) << std::strerror(errno);
    if (n < 0) return m;
    m.payload.assign(buf, static_cast<size_t>(n));
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_type == SCM_RIGHTS) {
        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          m.fds.emplace_back(fd);
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
        m.sender = cred.pid;
      }
    }
    return m;
  }

 private:
  std::string dir_, address_;
  UniqueFd sock_;
};

UniqueFd MemfdWith(const std::string& content) {
  UniqueFd fd(::memfd_create("fd-store-test", MFD_CLOEXEC));
  EXPECT_EQ(::pwrite(fd.get(), content.data(), content.size(), 0), static_cast<ssize_t>(content.size()));
  return fd;
}

std::string Content(int fd, size_t size) {
  std::string s(size, '\0');
  const ssize_t n = ::pread(fd, s.data(), size, 0);
  s.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return s;
}

std::unique_ptr<FdStore> ConnectTo(const FakeManager& manager) {
  auto store = FdStore::Connect(manager.address());
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

TEST(FdStoreTest, PutSendsTheNameAndTheMemfdItself) {
  FakeManager manager;
  auto store = ConnectTo(manager);
  ASSERT_NE(store, nullptr);
  UniqueFd memfd = MemfdWith("pages of a slab");
  ASSERT_TRUE(store->Put("slab-1", memfd.get()).ok());
  FakeManager::Message m = manager.Receive();
  EXPECT_EQ(m.payload, "FDSTORE=1\nFDNAME=slab-1\nFDPOLL=0\n");
  EXPECT_EQ(m.sender, ::getpid());
  ASSERT_EQ(m.fds.size(), 1u);
  EXPECT_EQ(Content(m.fds[0].get(), 64), "pages of a slab");
  struct stat ours, theirs;
  ASSERT_EQ(::fstat(memfd.get(), &ours), 0);
  ASSERT_EQ(::fstat(m.fds[0].get(), &theirs), 0);
  EXPECT_EQ(ours.st_ino, theirs.st_ino);        // the same file, not a copy
  EXPECT_GE(::fcntl(memfd.get(), F_GETFD), 0);  // the caller keeps its own
}

TEST(FdStoreTest, RemoveSendsTheName) {
  FakeManager manager;
  auto store = ConnectTo(manager);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Remove("journal").ok());
  FakeManager::Message m = manager.Receive();
  EXPECT_EQ(m.payload, "FDSTOREREMOVE=1\nFDNAME=journal\n");
  EXPECT_TRUE(m.fds.empty());
}

TEST(FdStoreTest, AnAbstractAddress) {
  const std::string name = absl::StrCat("hisparse-fd-store-test-", ::getpid());
  FakeManager manager(name);
  auto store = ConnectTo(manager);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->address(), "@" + name);
  ASSERT_TRUE(store->Remove("journal").ok());
  EXPECT_EQ(manager.Receive().payload, "FDSTOREREMOVE=1\nFDNAME=journal\n");
}

TEST(FdStoreTest, BarrierReturnsOnceTheManagerClosesItsEnd) {
  FakeManager manager;
  auto store = ConnectTo(manager);
  ASSERT_NE(store, nullptr);
  absl::Status barrier = absl::UnknownError("not run");
  std::thread waiter([&] { barrier = store->Barrier(absl::Seconds(60)); });
  FakeManager::Message m = manager.Receive();
  EXPECT_EQ(m.payload, "BARRIER=1\n");
  ASSERT_EQ(m.fds.size(), 1u);
  m.fds.clear();  // processed: the barrier's descriptor closes
  waiter.join();
  EXPECT_TRUE(barrier.ok()) << barrier;
}

TEST(FdStoreTest, BarrierTimesOutWhileTheManagerHoldsItsEnd) {
  FakeManager manager;
  auto store = ConnectTo(manager);
  ASSERT_NE(store, nullptr);
  FakeManager::Message held;
  std::thread reader([&] { held = manager.Receive(); });
  const absl::Status st = store->Barrier(absl::Milliseconds(50));
  reader.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_EQ(held.fds.size(), 1u);
}

TEST(FdStoreTest, BadNamesAreRefused) {
  FakeManager manager;
  auto store = ConnectTo(manager);
  ASSERT_NE(store, nullptr);
  UniqueFd memfd = MemfdWith("x");
  for (const std::string& name : {std::string(), std::string("a:b"), std::string(256, 'n'), std::string("a\nb"),
                                  std::string("tab\t"), std::string("\x7f"), std::string("caf\xc3\xa9")}) {
    EXPECT_FALSE(IsValidFdName(name)) << name;
    EXPECT_EQ(store->Put(name, memfd.get()).code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(store->Remove(name).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  EXPECT_THAT(std::string(store->Put("a:b", memfd.get()).message()), HasSubstr("a:b"));
  EXPECT_EQ(store->Put("slab-1", -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsValidFdName(std::string(255, 'n')));
  EXPECT_TRUE(IsValidFdName("with space ~!"));
  // Nothing refused reached the manager: the first message it gets is this one.
  ASSERT_TRUE(store->Remove(std::string(255, 'n')).ok());
  EXPECT_EQ(manager.Receive().payload, absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", std::string(255, 'n'), "\n"));
}

TEST(FdStoreTest, ConnectRefusesWhatCannotBeAManager) {
  EXPECT_EQ(FdStore::Connect("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FdStore::Connect("@").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FdStore::Connect("relative/notify").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FdStore::Connect("/" + std::string(200, 'x')).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status missing = FdStore::Connect("/nonexistent-hisparse-dir/notify").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnavailable) << missing;
  EXPECT_THAT(std::string(missing.message()), HasSubstr("/nonexistent-hisparse-dir/notify"));
}

TEST(FdStoreTest, FromEnvironment) {
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_EQ(FdStore::FromEnvironment().status().code(), absl::StatusCode::kNotFound);
  ::setenv("NOTIFY_SOCKET", "", 1);
  EXPECT_EQ(FdStore::FromEnvironment().status().code(), absl::StatusCode::kNotFound);
  FakeManager manager;
  ::setenv("NOTIFY_SOCKET", manager.address().c_str(), 1);
  auto store = FdStore::FromEnvironment();
  ::unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Remove("journal").ok());
  EXPECT_EQ(manager.Receive().payload, "FDSTOREREMOVE=1\nFDNAME=journal\n");
}

// A manager that reads nothing: its queue fills, and a send gives up (after 2 s) instead of
// hanging the daemon.
TEST(FdStoreTest, AWedgedManagerTimesTheSendOut) {
  FakeManager manager;
  auto store = ConnectTo(manager);
  ASSERT_NE(store, nullptr);
  absl::Status st;
  for (int i = 0; i < 100000 && st.ok(); ++i) st = store->Remove("journal");
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
}

TEST(FdStoreTest, ConcurrentPutsArriveWhole) {
  FakeManager manager;
  auto store = ConnectTo(manager);
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 4, kEach = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      UniqueFd memfd = MemfdWith(absl::StrCat("thread ", t));
      for (int i = 0; i < kEach; ++i) EXPECT_TRUE(store->Put(absl::StrCat("t", t), memfd.get()).ok());
    });
  }
  std::vector<int> seen(kThreads, 0);
  for (int i = 0; i < kThreads * kEach; ++i) {
    FakeManager::Message m = manager.Receive();
    ASSERT_EQ(m.fds.size(), 1u);
    int t = -1;
    ASSERT_EQ(std::sscanf(m.payload.c_str(), "FDSTORE=1\nFDNAME=t%d\nFDPOLL=0\n", &t), 1) << m.payload;
    ASSERT_TRUE(t >= 0 && t < kThreads);
    EXPECT_EQ(Content(m.fds[0].get(), 64), absl::StrCat("thread ", t));
    ++seen[t];
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(seen, std::vector<int>(kThreads, kEach));
}

// ---- TakeListenFds: each case runs in a forked child, which may put descriptors at 3.. and
// change its environment; it returns what went wrong ("" when nothing did).

std::string InChild(const std::function<std::string()>& body) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return "pipe2 failed";
  // Out of the way of 3..: the cases place descriptors there.
  UniqueFd read_end(::fcntl(ends[0], F_DUPFD_CLOEXEC, 200));
  UniqueFd write_end(::fcntl(ends[1], F_DUPFD_CLOEXEC, 200));
  ::close(ends[0]);
  ::close(ends[1]);
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";  // no child: waitpid(-1) below would reap any
  if (pid == 0) {
    const std::string failure = body();
    (void)!::write(write_end.get(), failure.data(), failure.size());
    ::_exit(0);
  }
  write_end.Reset();
  std::string failure;
  char buf[512];
  ssize_t n;
  while ((n = ::read(read_end.get(), buf, sizeof(buf))) > 0) failure.append(buf, static_cast<size_t>(n));
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) absl::StrAppend(&failure, " (child wait status ", status, ")");
  return failure;
}

#define CHILD_CHECK(cond) \
  if (!(cond)) return absl::StrCat(__LINE__, ": ", #cond)

// Puts memfds holding "fd0", "fd1", ... at 3, 4, ...
void PlaceMemfds(int n) {
  for (int i = 0; i < n; ++i) {
    UniqueFd made = MemfdWith(absl::StrCat("fd", i));  // may itself land at 3..
    UniqueFd memfd(::fcntl(made.get(), F_DUPFD_CLOEXEC, 300));
    made.Reset();
    ::dup2(memfd.get(), 3 + i);  // without close-on-exec, as a manager passes them
  }
}

bool EnvironmentCleared() {
  return std::getenv("LISTEN_PID") == nullptr && std::getenv("LISTEN_FDS") == nullptr &&
         std::getenv("LISTEN_FDNAMES") == nullptr;
}

TEST(TakeListenFdsTest, TakesOurDescriptorsWithTheirNames) {
  EXPECT_EQ(InChild([]() -> std::string {
              PlaceMemfds(3);
              ::setenv("LISTEN_PID", absl::StrCat(::getpid()).c_str(), 1);
              ::setenv("LISTEN_FDS", "3", 1);
              ::setenv("LISTEN_FDNAMES", "slab-1:slab-2:journal", 1);
              auto taken = TakeListenFds();
              CHILD_CHECK(taken.ok());
              CHILD_CHECK(taken->size() == 3);
              const char* names[] = {"slab-1", "slab-2", "journal"};
              for (int i = 0; i < 3; ++i) {
                const ListenFd& f = (*taken)[static_cast<size_t>(i)];
                CHILD_CHECK(f.name == names[i]);
                CHILD_CHECK(f.fd.get() == 3 + i);
                CHILD_CHECK((::fcntl(f.fd.get(), F_GETFD) & FD_CLOEXEC) != 0);
                CHILD_CHECK(Content(f.fd.get(), 16) == absl::StrCat("fd", i));
              }
              CHILD_CHECK(EnvironmentCleared());
              taken->clear();
              CHILD_CHECK(::fcntl(3, F_GETFD) < 0);  // owned: closed with the vector
              return "";
            }),
            "");
}

TEST(TakeListenFdsTest, MissingNamesReadUnknown) {
  EXPECT_EQ(InChild([]() -> std::string {
              PlaceMemfds(3);
              ::setenv("LISTEN_PID", absl::StrCat(::getpid()).c_str(), 1);
              ::setenv("LISTEN_FDS", "3", 1);
              ::unsetenv("LISTEN_FDNAMES");
              auto unnamed = TakeListenFds();
              CHILD_CHECK(unnamed.ok() && unnamed->size() == 3);
              for (const ListenFd& f : *unnamed) CHILD_CHECK(f.name == "unknown");
              unnamed->clear();
              PlaceMemfds(3);
              ::setenv("LISTEN_PID", absl::StrCat(::getpid()).c_str(), 1);
              ::setenv("LISTEN_FDS", "3", 1);
              ::setenv("LISTEN_FDNAMES", "a::c", 1);
              auto partly = TakeListenFds();
              CHILD_CHECK(partly.ok() && partly->size() == 3);
              CHILD_CHECK((*partly)[0].name == "a" && (*partly)[1].name == "unknown" && (*partly)[2].name == "c");
              return "";
            }),
            "");
}

TEST(TakeListenFdsTest, AnotherProcesssDescriptorsAreLeftAlone) {
  EXPECT_EQ(InChild([]() -> std::string {
              PlaceMemfds(2);
              ::setenv("LISTEN_PID", absl::StrCat(::getppid()).c_str(), 1);  // inherited from the parent
              ::setenv("LISTEN_FDS", "2", 1);
              ::setenv("LISTEN_FDNAMES", "a:b", 1);
              auto taken = TakeListenFds();
              CHILD_CHECK(taken.ok() && taken->empty());
              CHILD_CHECK(::fcntl(3, F_GETFD) == 0);  // open, and still without close-on-exec
              CHILD_CHECK(::fcntl(4, F_GETFD) == 0);
              CHILD_CHECK(EnvironmentCleared());
              ::unsetenv("LISTEN_PID");
              auto none = TakeListenFds();
              CHILD_CHECK(none.ok() && none->empty());
              return "";
            }),
            "");
}

TEST(TakeListenFdsTest, MalformedValuesAreErrors) {
  struct Case {
    const char* pid;  // "self" for our own
    const char* fds;
    const char* names;  // nullptr: unset
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"abc", "1", nullptr, absl::StatusCode::kInvalidArgument},
      {"0", "1", nullptr, absl::StatusCode::kInvalidArgument},
      {"-5", "1", nullptr, absl::StatusCode::kInvalidArgument},
      {"self", "x", nullptr, absl::StatusCode::kInvalidArgument},
      {"self", "-1", nullptr, absl::StatusCode::kInvalidArgument},
      {"self", "99999999999", nullptr, absl::StatusCode::kInvalidArgument},
      {"self", "2", "only-one", absl::StatusCode::kInvalidArgument},
      {"self", "2", "a:b:c", absl::StatusCode::kInvalidArgument},
      {"self", "3", "a:b:c", absl::StatusCode::kFailedPrecondition},  // descriptor 5 is not open
  };
  for (const Case& c : cases) {
    EXPECT_EQ(InChild([&]() -> std::string {
                PlaceMemfds(2);
                ::close(5);
                const std::string pid = std::string(c.pid) == "self" ? absl::StrCat(::getpid()) : c.pid;
                ::setenv("LISTEN_PID", pid.c_str(), 1);
                ::setenv("LISTEN_FDS", c.fds, 1);
                if (c.names != nullptr) ::setenv("LISTEN_FDNAMES", c.names, 1);
                auto taken = TakeListenFds();
                CHILD_CHECK(!taken.ok());
                CHILD_CHECK(taken.status().code() == c.code);
                CHILD_CHECK(::fcntl(3, F_GETFD) == 0);  // nothing taken
                CHILD_CHECK(EnvironmentCleared());
                return "";
              }),
              "")
        << c.pid << " " << c.fds << " " << (c.names != nullptr ? c.names : "(unset)");
  }
}

}  // namespace fd_store_test
}  // namespace hisparse
