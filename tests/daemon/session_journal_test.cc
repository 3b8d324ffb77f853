// Restarts without loss, in one process (request_journal.h, request_journaling.cc): a session
// manager journals its durable requests into an fd store (a service manager played by this test
// with hisparse-keeper's own protocol pieces, on a real datagram socket); the manager and its pool
// are destroyed, as a killed daemon's are; a new pool and manager take back what the store kept,
// and a new session adopts the same pages with the same bytes. The recovery's refusals (a torn or
// tampered journal, unsealed or missing slabs, expired leases, another page size) are
// PlanRecovery's, tested on journals written here.
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "hisparse/common/fd_store.h"
#include "hisparse/common/unix_socket.h"
#include "hisparse/daemon/request_journal.h"
#include "hisparse/keeper/notify_protocol.h"
#include "session_test_util.h"

namespace hisparse {
namespace session_journal_test {

using session_test::AdmitOf;
using session_test::HostSession;
using session_test::kMiB;
using session_test::kPage;
using session_test::OpenHost;

// A service manager's fd store on a real datagram socket, served by a thread of this test with
// the keeper's ParseNotifyMessage and StoredFds (keeper/notify_protocol.h).
class FakeManager {
 public:
  FakeManager() : stored_(1 << 16) {
    dir_ = ::testing::TempDir() + "/journal_store_" + std::to_string(::getpid()) + "_" + std::to_string(++count_);
    ::mkdir(dir_.c_str(), 0700);
    path_ = dir_ + "/notify";
    sock_ = UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(sock_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeManager() {
    ::shutdown(sock_.get(), SHUT_RDWR);
    const std::unique_ptr<FdStore> s = Client();  // wakes the thread if shutdown did not
    (void)s->Put("stop", 0);
    thread_.join();
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  std::unique_ptr<FdStore> Client() const {
    auto store = FdStore::Connect(path_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  // What a restarted daemon would get (LISTEN_FDS): a dup of every stored fd, with its name.
  std::vector<ListenFd> Passed() {
    absl::MutexLock lock(&mu_);
    std::vector<ListenFd> out;
    const std::vector<std::string> names = stored_.names();
    const std::vector<int> fds = stored_.fds();
    for (size_t i = 0; i < names.size(); ++i) out.push_back(ListenFd{names[i], UniqueFd(::dup(fds[i]))});
    return out;
  }
  std::vector<std::string> Names() {
    absl::MutexLock lock(&mu_);
    return stored_.names();
  }

 private:
  void Serve() {
    for (;;) {
      absl::StatusOr<Packet> p = RecvPacket(sock_.get(), 4096);  // the store's messages carry one fd
      if (!p.ok()) return;
      const NotifyMessage m = ParseNotifyMessage(p->payload);
      if (m.fdname == "stop") return;
      absl::MutexLock lock(&mu_);
      if (m.fdstore && p->fd.valid()) {
        EXPECT_TRUE(stored_.Add(m.fdname, std::move(p->fd)).ok());
      } else if (m.fdstore_remove) {
        stored_.Remove(m.fdname);
      }
      // BARRIER: its fd closes here, now that everything before it is done.
    }
  }

  static inline int count_ = 0;
  std::string dir_, path_;
  UniqueFd sock_;
  absl::Mutex mu_;
  StoredFds stored_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

constexpr uint64_t kBudget = 16 * kMiB;
constexpr uint32_t kUid = 4242;

PagePool::Options PoolOptions(uint64_t first_slab_id) {
  PagePool::Options po = session_test::TestPoolOptions(kBudget);
  po.first_slab_id = first_slab_id;
  return po;
}

journal::Header Header(uint64_t generation, uint64_t epoch) {
  journal::Header h;
  h.set_format(RequestJournal::kFormat);
  h.set_generation(generation);
  h.set_epoch(epoch);
  h.set_page_bytes(kPage);
  h.set_daemon_version("test");
  return h;
}

// One life of the daemon: a journal in `manager`'s store, a pool holding what the store passed
// back (the plan), a session manager over both with the plan's orphans restored.
struct Life {
  RecoveryPlan plan;
  std::unique_ptr<RequestJournal> journal;
  std::unique_ptr<SessionManager> sm;

  static std::unique_ptr<Life> Start(FakeManager& manager, absl::Time now = absl::Now()) {
    auto life = std::make_unique<Life>();
    life->plan = PlanRecovery(manager.Passed(), kPage, kBudget, now);
    const uint64_t epoch = life->plan.next_epoch();
    const uint64_t first_id = epoch == 0 ? 1 : (epoch << 40) | 1;
    auto pool = PagePool::Create(PoolOptions(first_id), std::move(life->plan.slabs));
    EXPECT_TRUE(pool.ok()) << pool.status();
    if (!pool.ok()) return nullptr;
    for (const auto& [name, fd] : life->plan.unused) life->plan.stale_names.push_back(name);
    auto journal = RequestJournal::Start(manager.Client(),
                                         Header(life->plan.found ? life->plan.header.generation() + 1 : 1, epoch),
                                         life->plan.puts, StoredIds(life->plan), life->plan.stale_names);
    EXPECT_TRUE(journal.ok()) << journal.status();
    if (!journal.ok()) return nullptr;
    life->journal = *std::move(journal);
    SessionManager::Options o;
    o.journal = life->journal.get();
    o.first_session_id = first_id;
    o.max_lease_seconds = 3600;
    life->sm = std::make_unique<SessionManager>(o, std::move(*pool));
    auto restored = life->sm->RestoreOrphans(life->plan.puts);
    EXPECT_TRUE(restored.ok()) << restored.status();
    return life;
  }
  static std::set<uint64_t> StoredIds(const RecoveryPlan& plan) {
    std::set<uint64_t> ids;
    for (const journal::Put& put : plan.puts) {
      for (const journal::Layer& l : put.layers()) ids.insert(l.slab().begin(), l.slab().end());
    }
    return ids;
  }
};

HostSession Engine() {
  HostSession e;
  e.engine_name = "journaled-engine";
  e.layers = 2;
  e.record_bytes = 16;
  return e;
}

// The record bytes a test writes at (request, layer, position).
uint8_t Byte(uint64_t request, uint32_t layer, uint32_t position, uint32_t i) {
  return static_cast<uint8_t>(request * 131 + layer * 17 + position * 7 + i * 3 + 1);
}

void WriteRecords(SessionManager& sm, uint64_t session, uint64_t request, uint32_t tokens) {
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (uint32_t p = 0; p < tokens; ++p) {
      auto rec = sm.RecordForTest(session, request, layer, p);
      ASSERT_TRUE(rec.ok()) << rec.status();
      for (uint32_t i = 0; i < 16; ++i) (*rec)[i] = Byte(request, layer, p, i);
    }
  }
}

void ExpectRecords(SessionManager& sm, uint64_t session, uint64_t request, uint32_t tokens) {
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (uint32_t p = 0; p < tokens; ++p) {
      auto rec = sm.RecordForTest(session, request, layer, p);
      ASSERT_TRUE(rec.ok()) << rec.status();
      for (uint32_t i = 0; i < 16; ++i) ASSERT_EQ((*rec)[i], Byte(request, layer, p, i)) << layer << " " << p;
    }
  }
}

std::vector<std::string> PagesOf(const google::protobuf::RepeatedPtrField<v1::LayerPages>& layers) {
  std::vector<std::string> out;
  for (const v1::LayerPages& l : layers) {
    for (const v1::PageRef& p : l.pages()) out.push_back(absl::StrCat(l.layer(), ":", p.slab(), "@", p.offset()));
  }
  return out;
}

// An AdmitRequest of a durable request (a lease of `lease` seconds).
v1::AdmitRequest DurableAdmit(const v1::SessionRef& ref, uint64_t id, uint32_t tokens, uint32_t lease = 600) {
  v1::AdmitRequest a = AdmitOf(ref, id, tokens);
  a.set_lease_seconds(lease);
  return a;
}

// `heir` adopts every durable request of the ended session `dead`.
absl::StatusOr<v1::AdoptResponse> AdoptInto(SessionManager& sm, const v1::SessionRef& heir, uint64_t dead) {
  v1::AdoptRequest adopt;
  *adopt.mutable_session() = heir;
  adopt.set_dead_session_id(dead);
  return sm.Adopt(adopt);
}

TEST(SessionJournalTest, DurableRequestsOutliveTheManagerWithTheirBytes) {
  FakeManager manager;
  std::unique_ptr<Life> first = Life::Start(manager);
  ASSERT_NE(first, nullptr);
  EXPECT_FALSE(first->plan.found);
  SessionManager& sm = *first->sm;
  const v1::SessionRef ref = OpenHost(sm, Engine(), kUid);
  // 7: durable, extended (pages added after the journal first held it); 8: not durable; 9:
  // durable then released; 10: durable then its lease cleared; 11: a shared-prefix child of 7.
  v1::AdmitRequest a7 = DurableAdmit(ref, 7, 300);
  ASSERT_TRUE(sm.Admit(a7).ok());
  v1::ExtendRequest ext;
  *ext.mutable_session() = ref;
  ext.set_request_id(7);
  ext.set_token_budget(700);
  absl::StatusOr<v1::ExtendResponse> extended = sm.Extend(ext);
  ASSERT_TRUE(extended.ok()) << extended.status();
  ASSERT_TRUE(sm.Admit(AdmitOf(ref, 8, 300)).ok());
  v1::AdmitRequest a9 = DurableAdmit(ref, 9, 300);
  ASSERT_TRUE(sm.Admit(a9).ok());
  ASSERT_TRUE(session_test::Release(sm, ref, 9).ok());
  v1::AdmitRequest a10 = DurableAdmit(ref, 10, 300);
  ASSERT_TRUE(sm.Admit(a10).ok());
  v1::SetLeaseRequest unlease;
  *unlease.mutable_session() = ref;
  unlease.set_request_id(10);
  unlease.set_lease_seconds(0);
  ASSERT_TRUE(sm.SetLease(unlease).ok());
  v1::AdmitRequest a11 = DurableAdmit(ref, 11, 600);
  a11.set_parent_request_id(7);
  a11.set_prefix_tokens(512);  // two whole pages of 256 records shared, per layer
  absl::StatusOr<v1::AdmitResponse> admitted11 = sm.Admit(a11);
  ASSERT_TRUE(admitted11.ok()) << admitted11.status();
  ASSERT_NO_FATAL_FAILURE(WriteRecords(sm, ref.session_id(), 7, 700));
  ASSERT_NO_FATAL_FAILURE(WriteRecords(sm, ref.session_id(), 8, 300));
  const std::vector<std::string> pages7 = PagesOf(extended->layers());
  const RequestJournal::Stats js = first->journal->GetStats();
  EXPECT_EQ(js.live_requests, 2u);  // 7 and 11
  EXPECT_GT(js.stored_slabs, 0u);
  EXPECT_INVARIANTS(sm);

  // The daemon dies: nothing is closed, released or flushed beyond what each call did.
  first.reset();

  std::unique_ptr<Life> second = Life::Start(manager);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->plan.found);
  EXPECT_TRUE(second->plan.refused.empty()) << second->plan.refused;
  EXPECT_EQ(second->plan.puts.size(), 2u);
  EXPECT_EQ(second->plan.header.epoch(), 0u);
  SessionManager& sm2 = *second->sm;
  EXPECT_INVARIANTS(sm2);
  EXPECT_EQ(sm2.Stats().orphaned_requests(), 2u);
  // Another tenant sees nothing of it; the same tenant and engine adopt it.
  const v1::SessionRef stranger = OpenHost(sm2, Engine(), kUid + 1);
  v1::ListAdoptableRequest list;
  *list.mutable_session() = stranger;
  ASSERT_EQ(sm2.ListAdoptable(list)->requests_size(), 0);
  const v1::SessionRef heir = OpenHost(sm2, Engine(), kUid);
  EXPECT_GT(heir.session_id(), 1ull << 40);  // a new life's ids never name a former life's
  *list.mutable_session() = heir;
  absl::StatusOr<v1::ListAdoptableResponse> adoptable = sm2.ListAdoptable(list);
  ASSERT_TRUE(adoptable.ok()) << adoptable.status();
  ASSERT_EQ(adoptable->requests_size(), 2);  // 7 and 11, of the dead session
  EXPECT_EQ(adoptable->requests(0).dead_session_id(), ref.session_id());
  absl::StatusOr<v1::AdoptResponse> adopted = AdoptInto(sm2, heir, ref.session_id());
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  ASSERT_EQ(adopted->requests_size(), 2);
  for (const v1::AdoptedRequest& r : adopted->requests()) {
    if (r.request_id() == 7) {
      EXPECT_EQ(r.capacity_tokens(), 700u);
      EXPECT_EQ(PagesOf(r.layers()), pages7);
    } else {
      EXPECT_EQ(r.request_id(), 11u);
    }
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRecords(sm2, heir.session_id(), 7, 700));
  EXPECT_INVARIANTS(sm2);

  // Once more: the adoption was journaled (a Forget under the dead session, a Put under the
  // heir), so a second restart finds the requests under the heir's id, durable still.
  second.reset();
  std::unique_ptr<Life> third = Life::Start(manager);
  ASSERT_NE(third, nullptr);
  ASSERT_EQ(third->plan.puts.size(), 2u);
  for (const journal::Put& put : third->plan.puts) EXPECT_EQ(put.session().id(), heir.session_id());
  EXPECT_EQ(third->plan.header.epoch(), 1u);
  const v1::SessionRef heir2 = OpenHost(*third->sm, Engine(), kUid);
  EXPECT_GT(heir2.session_id(), 2ull << 40);
  ASSERT_TRUE(AdoptInto(*third->sm, heir2, heir.session_id()).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectRecords(*third->sm, heir2.session_id(), 7, 700));
  // Released: its slabs leave the pool and the store; only the journal is left there.
  ASSERT_TRUE(session_test::Release(*third->sm, heir2, 11).ok());
  ASSERT_TRUE(session_test::Release(*third->sm, heir2, 7).ok());
  third->sm->CloseSession(heir2.session_id());
  third->sm->WaitPoolIdle();
  EXPECT_INVARIANTS(*third->sm);
  EXPECT_EQ(third->journal->GetStats().live_requests, 0u);
  // The store processes messages in order: a barrier through a client of our own sees it done.
  ASSERT_TRUE(manager.Client()->Barrier().ok());
  const std::vector<std::string> names = manager.Names();
  ASSERT_EQ(names.size(), 1u) << absl::StrJoin(names, " ");
  EXPECT_EQ(names[0].rfind("journal-", 0), 0u) << names[0];
}

// A lease renewed over and over writes a Put each time: the journal compacts itself into new
// generations (the store keeps only the newest), and a restart still finds the request as it is.
TEST(SessionJournalTest, TheJournalCompactsAndStillRecovers) {
  FakeManager manager;
  std::unique_ptr<Life> first = Life::Start(manager);
  ASSERT_NE(first, nullptr);
  SessionManager& sm = *first->sm;
  const v1::SessionRef ref = OpenHost(sm, Engine(), kUid);
  v1::AdmitRequest a = DurableAdmit(ref, 7, 300);
  ASSERT_TRUE(sm.Admit(a).ok());
  ASSERT_NO_FATAL_FAILURE(WriteRecords(sm, ref.session_id(), 7, 300));
  v1::SetLeaseRequest renew;
  *renew.mutable_session() = ref;
  renew.set_request_id(7);
  const uint64_t generation = first->journal->GetStats().generation;
  for (int i = 0; i < 20000 && first->journal->GetStats().compactions < 2; ++i) {
    renew.set_lease_seconds(600 + i % 7);
    ASSERT_TRUE(sm.SetLease(renew).ok());
  }
  const RequestJournal::Stats js = first->journal->GetStats();
  EXPECT_GE(js.compactions, 2u);
  EXPECT_EQ(js.generation, generation + js.compactions);
  EXPECT_EQ(js.live_requests, 1u);
  EXPECT_LT(js.bytes, 3u << 20);  // compacted: bounded by twice the live size plus 1 MiB
  ASSERT_TRUE(manager.Client()->Barrier().ok());
  int journals = 0;
  for (const std::string& name : manager.Names()) journals += name.rfind("journal-", 0) == 0 ? 1 : 0;
  EXPECT_EQ(journals, 1);
  first.reset();

  std::unique_ptr<Life> second = Life::Start(manager);
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(second->plan.refused.empty()) << second->plan.refused;
  ASSERT_EQ(second->plan.puts.size(), 1u);
  const v1::SessionRef heir = OpenHost(*second->sm, Engine(), kUid);
  ASSERT_TRUE(AdoptInto(*second->sm, heir, ref.session_id()).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectRecords(*second->sm, heir.session_id(), 7, 300));
  EXPECT_INVARIANTS(*second->sm);
}

// A journal write that fails (here RLIMIT_FSIZE, as a memory cgroup could) loses nothing: the
// call succeeds, the failure is counted, and the next commit writes the whole live state as a new
// generation, so a restart finds the request as its last answer left it.
TEST(SessionJournalTest, AFailedJournalWriteIsRepairedByTheNextCommit) {
  FakeManager manager;
  std::unique_ptr<Life> first = Life::Start(manager);
  ASSERT_NE(first, nullptr);
  SessionManager& sm = *first->sm;
  const v1::SessionRef ref = OpenHost(sm, Engine(), kUid);
  v1::AdmitRequest a7 = DurableAdmit(ref, 7, 300, 3000);
  ASSERT_TRUE(sm.Admit(a7).ok());
  ASSERT_NO_FATAL_FAILURE(WriteRecords(sm, ref.session_id(), 7, 300));
  const RequestJournal::Stats before = first->journal->GetStats();
  // The lease is shortened while the journal cannot grow (only its record changes).
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto previous = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  rlimit tight = old;
  tight.rlim_cur = before.bytes + 8;  // the next record does not fit
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tight), 0);
  v1::SetLeaseRequest shorten;
  *shorten.mutable_session() = ref;
  shorten.set_request_id(7);
  shorten.set_lease_seconds(600);
  const absl::StatusOr<v1::SetLeaseResponse> shortened = sm.SetLease(shorten);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, previous);
  ASSERT_TRUE(shortened.ok()) << shortened.status();
  EXPECT_GT(first->journal->GetStats().failures, before.failures);
  v1::AdmitRequest a8 = DurableAdmit(ref, 8, 300);
  ASSERT_TRUE(sm.Admit(a8).ok());
  // The failed append was cut off and the whole live state written anew (at once, or at this
  // commit if that rewrite did not fit either).
  EXPECT_GT(first->journal->GetStats().generation, before.generation);
  first.reset();

  std::unique_ptr<Life> second = Life::Start(manager);
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(second->plan.refused.empty()) << second->plan.refused;
  ASSERT_EQ(second->plan.puts.size(), 2u);
  for (const journal::Put& put : second->plan.puts) {
    // Both leases end within 600 s: request 7's as the failed write left it, not 3000 s.
    EXPECT_LT(absl::FromUnixNanos(put.lease_end_unix_nanos()), absl::Now() + absl::Seconds(601)) << put.request_id();
  }
  const v1::SessionRef heir = OpenHost(*second->sm, Engine(), kUid);
  ASSERT_TRUE(AdoptInto(*second->sm, heir, ref.session_id()).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectRecords(*second->sm, heir.session_id(), 7, 300));
}

// Random admissions (durable or not, some sharing a prefix), extensions, releases, lease changes,
// session ends and adoptions, against a shadow model kept from the answers alone: after a crash at
// the end, a new manager holds exactly the requests the shadow says are durable, each under the
// session the shadow says, with the pages its last answer gave and the signatures written there.
TEST(SessionJournalTest, PropertyRandomLivesRecoverWhatTheShadowSaysIsDurable) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937_64 rng(seed);
    FakeManager manager;
    std::unique_ptr<Life> life = Life::Start(manager);
    ASSERT_NE(life, nullptr);
    SessionManager& sm = *life->sm;
    struct Shadow {
      uint64_t session = 0;
      bool durable = false;
      uint32_t capacity = 0;
      std::vector<std::string> pages;
    };
    std::map<uint64_t, Shadow> requests;  // by request id (unique in the run)
    std::vector<v1::SessionRef> open = {OpenHost(sm, Engine(), kUid), OpenHost(sm, Engine(), kUid)};
    std::set<uint64_t> orphans;
    uint64_t next_id = 1;
    auto in_session = [&](uint64_t session) {
      std::vector<uint64_t> ids;
      for (const auto& [id, r] : requests) {
        if (r.session == session) ids.push_back(id);
      }
      return ids;
    };
    auto pick = [&](const std::vector<uint64_t>& v) { return v[rng() % v.size()]; };
    auto stamp = [&](uint64_t session, uint64_t id) {
      const Shadow& r = requests.at(id);
      // The last record: never on a page shared with another request (a prefix is at most one
      // page here, a request is longer).
      for (uint32_t layer = 0; layer < 2; ++layer) {
        for (uint32_t pos : {r.capacity - 1}) {
          auto rec = sm.RecordForTest(session, id, layer, pos);
          ASSERT_TRUE(rec.ok()) << rec.status();
          for (uint32_t i = 0; i < 16; ++i) (*rec)[i] = Byte(id, layer, pos, i);
        }
      }
    };
    for (int op = 0; op < 150; ++op) {
      const v1::SessionRef& ref = open[rng() % open.size()];
      const std::vector<uint64_t> mine = in_session(ref.session_id());
      switch (rng() % 7) {
        case 0:
        case 1: {  // admit, durable or not, a shared-prefix child now and then
          v1::AdmitRequest a = AdmitOf(ref, next_id, 300 + static_cast<uint32_t>(rng() % 300));
          if (rng() % 2 == 0) a.set_lease_seconds(600);
          if (!mine.empty() && rng() % 4 == 0) {
            const uint64_t parent = pick(mine);
            a.set_parent_request_id(parent);
            a.set_prefix_tokens(std::min<uint32_t>(256, requests.at(parent).capacity));
            a.set_token_budget(std::max<uint32_t>(a.token_budget(), a.prefix_tokens() + 1));
          }
          absl::StatusOr<v1::AdmitResponse> got = sm.Admit(a);
          ASSERT_TRUE(got.ok()) << got.status();
          requests[next_id] =
              Shadow{ref.session_id(), a.lease_seconds() != 0, got->capacity_tokens(), PagesOf(got->layers())};
          ASSERT_NO_FATAL_FAILURE(stamp(ref.session_id(), next_id));
          ++next_id;
          break;
        }
        case 2: {  // extend
          if (mine.empty()) break;
          const uint64_t id = pick(mine);
          v1::ExtendRequest e;
          *e.mutable_session() = ref;
          e.set_request_id(id);
          e.set_token_budget(requests.at(id).capacity + 256);
          absl::StatusOr<v1::ExtendResponse> got = sm.Extend(e);
          ASSERT_TRUE(got.ok()) << got.status();
          requests[id].capacity = got->capacity_tokens();
          requests[id].pages = PagesOf(got->layers());
          ASSERT_NO_FATAL_FAILURE(stamp(ref.session_id(), id));
          break;
        }
        case 3: {  // release
          if (mine.empty()) break;
          const uint64_t id = pick(mine);
          ASSERT_TRUE(session_test::Release(sm, ref, id).ok());
          requests.erase(id);
          break;
        }
        case 4: {  // a lease set or cleared
          if (mine.empty()) break;
          const uint64_t id = pick(mine);
          v1::SetLeaseRequest l;
          *l.mutable_session() = ref;
          l.set_request_id(id);
          l.set_lease_seconds(rng() % 2 == 0 ? 600 : 0);
          ASSERT_TRUE(sm.SetLease(l).ok());
          requests[id].durable = l.lease_seconds() != 0;
          break;
        }
        case 5: {  // a session ends (its durable requests an orphan) and another opens
          const size_t which = rng() % open.size();
          const uint64_t ended = open[which].session_id();
          sm.CloseSession(ended);
          bool kept = false;
          for (uint64_t id : in_session(ended)) {
            if (requests[id].durable) {
              kept = true;
            } else {
              requests.erase(id);
            }
          }
          if (kept) orphans.insert(ended);
          open[which] = OpenHost(sm, Engine(), kUid);
          break;
        }
        case 6: {  // an orphan adopted
          if (orphans.empty()) break;
          const uint64_t dead = *std::next(orphans.begin(), static_cast<long>(rng() % orphans.size()));
          absl::StatusOr<v1::AdoptResponse> got = AdoptInto(sm, ref, dead);
          ASSERT_TRUE(got.ok()) << got.status();
          for (const v1::AdoptedRequest& r : got->requests()) {
            EXPECT_EQ(PagesOf(r.layers()), requests.at(r.request_id()).pages);
            requests[r.request_id()].session = ref.session_id();
          }
          orphans.erase(dead);
          break;
        }
      }
    }
    EXPECT_INVARIANTS(sm);
    life.reset();  // the crash

    std::unique_ptr<Life> next = Life::Start(manager);
    ASSERT_NE(next, nullptr);
    EXPECT_TRUE(next->plan.refused.empty()) << next->plan.refused;
    std::map<uint64_t, std::set<uint64_t>> want;  // session -> its durable requests
    for (const auto& [id, r] : requests) {
      if (r.durable) want[r.session].insert(id);
    }
    std::map<uint64_t, std::set<uint64_t>> got;
    for (const journal::Put& put : next->plan.puts) got[put.session().id()].insert(put.request_id());
    ASSERT_EQ(got, want);
    for (const auto& [session, ids] : want) {
      const v1::SessionRef heir = OpenHost(*next->sm, Engine(), kUid);
      absl::StatusOr<v1::AdoptResponse> adopted = AdoptInto(*next->sm, heir, session);
      ASSERT_TRUE(adopted.ok()) << adopted.status();
      for (const v1::AdoptedRequest& r : adopted->requests()) {
        const Shadow& s = requests.at(r.request_id());
        EXPECT_EQ(r.capacity_tokens(), s.capacity);
        EXPECT_EQ(PagesOf(r.layers()), s.pages) << r.request_id();
        for (uint32_t layer = 0; layer < 2; ++layer) {
          for (uint32_t pos : {s.capacity - 1}) {
            auto rec = next->sm->RecordForTest(heir.session_id(), r.request_id(), layer, pos);
            ASSERT_TRUE(rec.ok()) << rec.status();
            EXPECT_EQ((*rec)[5], Byte(r.request_id(), layer, pos, 5)) << r.request_id();
          }
        }
      }
    }
    EXPECT_INVARIANTS(*next->sm);
  }
}

}  // namespace session_journal_test
}  // namespace hisparse
