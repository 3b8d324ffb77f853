// The daemon's import target: hisparse-import-worker in a process of its own (import_target.h,
// import_worker/worker.h), driven over a SOCK_SEQPACKET pair by the messages of
// hisparse/common/import_channel.h.
//
// Threads and locks. Register and Unregister are calls: under call_mu_ (one call at a time on the
// channel) the caller sends its packets, then waits under mu_ for its kAck, for the worker's end,
// or for kCallTimeout (then it kills the worker). The reader thread owns the child: it reads
// every kAck, notices the channel's end, reaps the process (SIGKILL first: a worker whose channel
// ended is never left running with granted pages mapped), hands the grants it held to the tick
// thread as lost, and starts a new worker after a backoff. The tick thread calls on_tick and
// on_lost, which call back into this target (Unregister), so neither runs on the reader thread
// nor under mu_.
//
// Ownership: the worker process and the channel are the reader thread's (the channel is shared
// with a call in flight, so its descriptor outlives the call even when the worker dies
// meanwhile); a grant's slab descriptors are closed once sent (the worker holds dups).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hisparse/common/import_channel.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/deferred_log.h"
#include "hisparse/daemon/import_target.h"

extern char** environ;

namespace hisparse {
namespace {

constexpr int kChildChannelFd = 3;
constexpr absl::Duration kHelloTimeout = absl::Seconds(20);
constexpr absl::Duration kCallTimeout = absl::Seconds(10);
constexpr absl::Duration kTick = absl::Milliseconds(100);
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(200);
constexpr absl::Duration kMaxBackoff = absl::Seconds(10);
// A worker that lived this long ended by what a writer did, not by failing to start: the next
// starts after the first backoff again (a crash loop at start backs off up to kMaxBackoff).
constexpr absl::Duration kStableLife = absl::Seconds(2);

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("ended (wait status ", status, ")");
}

// SIGKILL and reap: after this the worker's mappings are gone, so nothing more is written.
std::string KillAndReap(pid_t pid) {
  if (pid <= 0) return "was never started";  // kill(-1) would signal every process we may
  ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return "was reaped elsewhere";
  }
  return DescribeExit(status);
}

struct Child {
  pid_t pid = -1;
  std::shared_ptr<UniqueFd> channel;  // shared with a call in flight
  std::string address;
  absl::Time started;
};

absl::Status WaitReadable(int fd, absl::Duration timeout) {
  pollfd p{fd, POLLIN, 0};
  const int n = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (n < 0) return ErrnoStatus(errno, "poll of the import worker's channel");
  if (n == 0) return absl::DeadlineExceededError(absl::StrCat("no answer in ", absl::FormatDuration(timeout)));
  return absl::OkStatus();
}

// Starts the worker and reads its hello.
absl::StatusOr<Child> Spawn(const ImportTargetOptions& o) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoStatus(errno, "socketpair for the import worker");
  }
  UniqueFd mine(sv[0]), theirs(sv[1]);
  if (theirs.get() == kChildChannelFd) {  // dup2 onto itself would keep close-on-exec
    theirs = UniqueFd(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, kChildChannelFd + 1));
    if (!theirs.valid()) return ErrnoStatus(errno, "dup of the import worker's channel");
  }
  std::vector<std::string> args = {o.worker_binary, "--channel-fd", std::to_string(kChildChannelFd), "--parent",
                                   std::to_string(::getpid())};
  if (!o.ucx_tls.empty()) args.insert(args.end(), {"--ucx-tls", o.ucx_tls});
  if (!o.ucx_net_devices.empty()) args.insert(args.end(), {"--ucx-net-devices", o.ucx_net_devices});
  if (o.worker_memory_bytes != 0)
    args.insert(args.end(), {"--memory-limit-bytes", std::to_string(o.worker_memory_bytes)});
  if (!LogEnabled(LogSeverity::kInfo)) args.push_back("--quiet");
  // Its lines go to the daemon's stderr, in the daemon's shape (NODE_NAME rides in the environment).
  const LogOptions log = GetLogOptions();
  if (log.format == LogFormat::kJson) args.push_back("--log-json");
  if (log.priority_prefix) args.push_back("--log-priority-prefix");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), kChildChannelFd);
  // The daemon blocks its stop signals (one thread sigwaits) and ignores SIGPIPE: the worker
  // starts with neither.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, o.worker_binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return ErrnoStatus(err, absl::StrCat("cannot start the import worker ", o.worker_binary));
  theirs.Reset();
  Child child{pid, std::make_shared<UniqueFd>(std::move(mine)), "", absl::Now()};
  absl::Status hello = WaitReadable(child.channel->get(), kHelloTimeout);
  absl::StatusOr<Packet> p = hello.ok() ? RecvPacket(child.channel->get(), kImportChannelMaxPacket) : hello;
  absl::StatusOr<ChannelMessage> m = p.ok() ? DecodeChannelMessage(p->payload) : p.status();
  const ChannelHello* h = m.ok() ? std::get_if<ChannelHello>(&*m) : nullptr;
  if (h == nullptr || h->version != kImportChannelVersion) {
    const std::string how = KillAndReap(pid);
    const std::string what = !m.ok()        ? std::string(m.status().message())
                             : h == nullptr ? "its first message was not a hello"
                                            : absl::StrCat("it speaks channel version ", h->version, ", not ",
                                                           kImportChannelVersion, " (a binary of another release?)");
    return absl::UnavailableError(
        absl::StrCat("the import worker ", o.worker_binary, " did not start: ", what, "; it ", how));
  }
  child.address = h->worker_address;
  return child;
}

class WorkerProcessTarget final : public ImportTarget {
 public:
  explicit WorkerProcessTarget(ImportTargetOptions o) : options_(std::move(o)) {}
  ~WorkerProcessTarget() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    const uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof(one));
    if (reader_.joinable()) reader_.join();
    if (ticker_.joinable()) ticker_.join();
  }

  absl::Status Start() {
    stop_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stop_fd_.valid()) return ErrnoStatus(errno, "eventfd for the import worker's threads");
    HS_ASSIGN_OR_RETURN(Child child, Spawn(options_));
    LOG(INFO) << "import: worker " << child.pid << " ready (" << child.address.size()
              << "-byte UCX address, transports " << (options_.ucx_tls.empty() ? "UCX default" : options_.ucx_tls)
              << "); writes arrive as checked active "
              << "messages in its process, no daemon memory is registered";
    {
      absl::MutexLock lock(&mu_);
      child_ = std::move(child);
      alive_ = true;
    }
    reader_ = std::thread([this] { ReaderLoop(); });
    ticker_ = std::thread([this] { TickLoop(); });
    return absl::OkStatus();
  }

  std::string WorkerAddress() const override {
    absl::MutexLock lock(&mu_);
    return child_.address;
  }

  absl::Status Register(const std::string& grant_id, Grant grant) override {
    std::vector<std::pair<std::string, int>> packets;  // each with the descriptor it carries (-1: none)
    for (const Slab& s : grant.slabs) packets.emplace_back(EncodeChannelMessage(ChannelSlab{s.bytes}), s.fd.get());
    ChannelPages piece;
    for (const auto& layer : grant.pages) {
      for (const ChannelPageRef& ref : layer) {
        piece.refs.push_back(ref);
        if (piece.refs.size() == kImportChannelPagesPerPacket) {
          packets.emplace_back(EncodeChannelMessage(piece), -1);
          piece.refs.clear();
        }
      }
    }
    if (!piece.refs.empty()) packets.emplace_back(EncodeChannelMessage(piece), -1);
    ChannelRegister reg{0, grant_id, grant.layout, grant.page_bytes, absl::ToUnixNanos(grant.expires)};
    if (grant.expires == absl::InfiniteFuture()) reg.expires_unix_ns = INT64_MAX;
    return Call(std::move(packets), std::move(reg));
  }

  void Unregister(const std::string& grant_id) override {
    {
      absl::MutexLock lock(&mu_);
      if (!registered_.contains(grant_id)) return;  // never registered, or lost with its worker
    }
    // Whatever the answer, the worker writes nothing more into the grant's pages: it acknowledged
    // after UcxImport::Unregister, or it was killed and reaped.
    (void)Call({}, ChannelUnregister{0, grant_id});
    absl::MutexLock lock(&mu_);
    registered_.erase(grant_id);
  }

 private:
  using Last = std::variant<ChannelRegister, ChannelUnregister>;

  // Sends `packets` and then `last` (whose seq it sets), waits for last's kAck.
  absl::Status Call(std::vector<std::pair<std::string, int>> packets, Last last) ABSL_LOCKS_EXCLUDED(mu_, call_mu_) {
    absl::MutexLock call(&call_mu_);
    std::shared_ptr<UniqueFd> channel;
    uint64_t epoch, seq;
    {
      absl::MutexLock lock(&mu_);
      if (!alive_) {
        return absl::UnavailableError(
            absl::StrCat("the import worker is down (", last_exit_, "); it restarts by itself"));
      }
      channel = child_.channel;
      epoch = epoch_;
      seq = ++seq_;
      std::visit([&](auto& m) { m.seq = seq; }, last);
      pending_ = Pending{seq, std::visit([](const auto& m) { return m.grant_id; }, last),
                         std::holds_alternative<ChannelRegister>(last)};
    }
    packets.emplace_back(std::visit([](const auto& m) { return EncodeChannelMessage(m); }, last), -1);
    absl::Status sent;
    for (const auto& [bytes, fd] : packets) {
      sent = SendPacket(channel->get(), bytes, fd);
      if (!sent.ok()) break;
    }
    DeferredLog log;  // written once the lock is released
    absl::MutexLock lock(&mu_);
    if (sent.ok()) {
      const auto answered = [this, seq, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return (ack_.has_value() && ack_->seq == seq) || epoch_ != epoch;
      };
      if (!mu_.AwaitWithTimeout(absl::Condition(&answered), kCallTimeout)) {
        DEFERRED_LOG(log, WARNING) << "import: worker " << child_.pid << " did not answer in "
                                   << absl::FormatDuration(kCallTimeout) << "; killing it";
        ::kill(child_.pid, SIGKILL);  // the reader reaps it and moves the epoch on
      }
    } else {
      ::kill(child_.pid, SIGKILL);  // a channel that takes no packet: the worker is gone or stuck
    }
    const auto ended = [this, seq, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (ack_.has_value() && ack_->seq == seq) || epoch_ != epoch;
    };
    mu_.Await(absl::Condition(&ended));
    pending_.reset();
    if (epoch_ != epoch || !ack_.has_value()) {
      return absl::UnavailableError(absl::StrCat("the import worker ended during the call (", last_exit_, ")"));
    }
    const ChannelAck ack = *std::exchange(ack_, std::nullopt);
    return absl::Status(ack.code, ack.message);
  }

  void ReaderLoop() {
    absl::Duration backoff = kFirstBackoff;
    absl::Time next_start = absl::InfinitePast();
    for (;;) {
      std::shared_ptr<UniqueFd> channel;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) break;
        if (alive_) channel = child_.channel;
      }
      if (channel == nullptr) {
        if (absl::Now() < next_start) {
          pollfd p{stop_fd_.get(), POLLIN, 0};
          ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(std::min(kTick, next_start - absl::Now()))) + 1);
          continue;
        }
        Restart(&backoff, &next_start);
        continue;
      }
      pollfd fds[2] = {{channel->get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) continue;
      if (fds[1].revents & POLLIN) break;
      if (fds[0].revents == 0) continue;
      absl::StatusOr<Packet> p = RecvPacket(channel->get(), kImportChannelMaxPacket);
      absl::StatusOr<ChannelMessage> m = p.ok() ? DecodeChannelMessage(p->payload) : p.status();
      const ChannelAck* ack = m.ok() ? std::get_if<ChannelAck>(&*m) : nullptr;
      if (ack != nullptr && !(p->fd.valid())) {
        if (TakeAck(*ack)) continue;
        m = absl::InvalidArgumentError(absl::StrCat("an answer to no call (seq ", ack->seq, ")"));
      }
      // The channel's end, or a worker that says what it should not: it goes.
      const std::string why = !m.ok() && absl::IsUnavailable(m.status()) ? "closed its channel"
                              : !m.ok()                                  ? std::string(m.status().message())
                                                                         : "sent what the daemon never asked for";
      Bury(why, &backoff, &next_start);
    }
    Shutdown();
  }

  // Stores an answer for the call waiting on it; false when no call waits for this seq.
  bool TakeAck(const ChannelAck& ack) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!pending_.has_value() || pending_->seq != ack.seq) return false;
    // Registered from the moment the worker says so: a worker that dies next loses it.
    if (pending_->registers && ack.code == absl::StatusCode::kOk) registered_.insert(pending_->grant_id);
    ack_ = ack;
    return true;
  }

  void Bury(const std::string& why, absl::Duration* backoff, absl::Time* next_start) ABSL_LOCKS_EXCLUDED(mu_) {
    pid_t pid;
    absl::Time started;
    {
      absl::MutexLock lock(&mu_);
      pid = child_.pid;
      started = child_.started;
    }
    const std::string how = KillAndReap(pid);  // its mappings are gone from here on
    const std::string reason = absl::StrCat("the import worker (pid ", pid, ") ", why, " and ", how);
    std::vector<std::string> lost;
    {
      absl::MutexLock lock(&mu_);
      alive_ = false;
      ++epoch_;
      last_exit_ = reason;
      lost.assign(registered_.begin(), registered_.end());
      registered_.clear();
      if (!lost.empty()) lost_.push_back({std::move(lost), reason});
      child_ = Child{};
    }
    if (absl::Now() - started >= kStableLife) *backoff = kFirstBackoff;
    *next_start = absl::Now() + *backoff;
    LOG(ERROR) << "import: " << reason << "; its open grants are aborted; a new worker starts in "
               << absl::FormatDuration(*backoff);
    *backoff = std::min(*backoff * 2, kMaxBackoff);
  }

  void Restart(absl::Duration* backoff, absl::Time* next_start) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::StatusOr<Child> child = Spawn(options_);
    if (!child.ok()) {
      LOG(ERROR) << "import: " << child.status().message() << "; trying again in " << absl::FormatDuration(*backoff);
      absl::MutexLock lock(&mu_);
      last_exit_ = std::string(child.status().message());
      *next_start = absl::Now() + *backoff;
      *backoff = std::min(*backoff * 2, kMaxBackoff);
      return;
    }
    LOG(WARNING) << "import: worker " << child->pid << " started again; new grants name its address";
    absl::MutexLock lock(&mu_);
    child_ = *std::move(child);
    alive_ = true;
  }

  // At the target's end: the worker reads the channel's end and exits; one that does not within
  // a second is killed.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_) {
    Child child;
    {
      absl::MutexLock lock(&mu_);
      if (!alive_) return;
      child = std::exchange(child_, Child{});
      alive_ = false;
      ++epoch_;
    }
    child.channel.reset();
    for (int i = 0; i < 100; ++i) {
      int status = 0;
      const pid_t r = ::waitpid(child.pid, &status, WNOHANG);
      if (r == child.pid || (r < 0 && errno != EINTR)) return;
      ::usleep(10000);
    }
    (void)KillAndReap(child.pid);
  }

  void TickLoop() {
    for (;;) {
      pollfd p{stop_fd_.get(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kTick)));
      if (p.revents & POLLIN) return;
      std::vector<Lost> lost;
      {
        absl::MutexLock lock(&mu_);
        lost.swap(lost_);
      }
      for (Lost& l : lost) {
        if (options_.on_lost) options_.on_lost(std::move(l.grant_ids), l.reason);
      }
      if (options_.on_tick) options_.on_tick();
    }
  }

  struct Pending {
    uint64_t seq;
    std::string grant_id;
    bool registers;
  };
  struct Lost {
    std::vector<std::string> grant_ids;
    std::string reason;
  };

  const ImportTargetOptions options_;
  UniqueFd stop_fd_;  // ends both threads
  absl::Mutex call_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  Child child_ ABSL_GUARDED_BY(mu_);
  bool alive_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // moves on when a worker ends
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<ChannelAck> ack_ ABSL_GUARDED_BY(mu_);
  std::string last_exit_ ABSL_GUARDED_BY(mu_) = "not started";
  absl::flat_hash_set<std::string> registered_ ABSL_GUARDED_BY(mu_);  // by the live worker
  std::vector<Lost> lost_ ABSL_GUARDED_BY(mu_);                       // for the tick thread's on_lost
  std::thread reader_, ticker_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ImportTarget>> StartImportTarget(const ImportTargetOptions& options) {
  auto target = std::make_unique<WorkerProcessTarget>(options);
  HS_RETURN_IF_ERROR(target->Start());
  return std::unique_ptr<ImportTarget>(std::move(target));
}

}  // namespace hisparse
