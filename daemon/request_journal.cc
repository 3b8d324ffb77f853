// The request journal: see request_journal.h.
#include "hisparse/daemon/request_journal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"

namespace hisparse {
namespace {

// Store names: "s<slab id in hex>" and "journal-<generation>". Short, because the service manager
// passes every name back in one environment string ($LISTEN_FDNAMES), which the kernel caps at
// 128 KiB: kMaxStoredSlabs names of at most 13 bytes (12 hex digits hold ids of epochs below 256)
// and their separators fit with room to spare.
constexpr char kSlabPrefix[] = "s";
constexpr char kJournalPrefix[] = "journal-";
constexpr size_t kFrameHeader = 8;                 // u32 length, u32 crc32c
constexpr uint32_t kMaxRecordBytes = 64u << 20;    // a 1M-token request of 256 layers is far less
constexpr uint64_t kCompactSlackBytes = 1u << 20;  // compact once end > 2 * live + this

std::string JournalName(uint64_t generation) { return absl::StrCat(kJournalPrefix, generation); }

// "PREFIX<number in `base`>" -> the number.
bool NumberAfter(const std::string& name, const char* prefix, int base, uint64_t* out) {
  const size_t n = std::strlen(prefix);
  if (name.size() <= n || name.size() > n + 16 || name.compare(0, n, prefix) != 0) return false;
  for (size_t i = n; i < name.size(); ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i])) || (base == 10 && !std::isdigit(name[i]))) return false;
  }
  *out = std::strtoull(name.c_str() + n, nullptr, base);
  return true;
}

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
    table[i] = c;
  }
  return table;
}

absl::StatusOr<UniqueFd> NewJournalMemfd() {
  UniqueFd fd(::memfd_create("hisparse-journal", MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "memfd_create of the request journal");
  return fd;
}

absl::Status WriteAll(int fd, const std::string& bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(errno, "writing the request journal");
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAll(int fd) {
  HS_ASSIGN_OR_RETURN(size_t size, FileSize(fd));
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(errno, "reading a request journal");
    done += static_cast<size_t>(n);
  }
  return out;
}

uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// A journal's records as read: whole frames in order, or why not. A torn last frame (a commit
// the kill cut short, which no reply announced) ends the records quietly, noted in `torn_tail`.
struct ReadJournal {
  std::vector<journal::Record> records;
  bool torn_tail = false;
};

absl::StatusOr<ReadJournal> ParseFrames(const std::string& bytes) {
  ReadJournal out;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t left = bytes.size() - at;
    if (left < kFrameHeader) {
      out.torn_tail = true;
      break;
    }
    const uint32_t len = LoadU32(&bytes[at]);
    const uint32_t crc = LoadU32(&bytes[at + 4]);
    if (len > kMaxRecordBytes) {
      return absl::DataLossError(absl::StrCat("the record at byte ", at, " claims ", len, " bytes"));
    }
    if (left - kFrameHeader < len) {
      out.torn_tail = true;
      break;
    }
    const auto* body = reinterpret_cast<const uint8_t*>(&bytes[at + kFrameHeader]);
    journal::Record record;
    if (RequestJournal::Crc32c(body, len) != crc || !record.ParseFromArray(body, static_cast<int>(len))) {
      if (at + kFrameHeader + len == bytes.size()) {
        out.torn_tail = true;
        break;
      }
      return absl::DataLossError(absl::StrCat("the record at byte ", at, " fails its checksum, and ",
                                              bytes.size() - at - kFrameHeader - len, " bytes follow it"));
    }
    out.records.push_back(std::move(record));
    at += kFrameHeader + len;
  }
  if (out.records.empty() || !out.records.front().has_header()) {
    return absl::DataLossError("it does not begin with a header");
  }
  return out;
}

// The newest Put of every request the records leave durable, by (session, request).
absl::StatusOr<std::map<std::pair<uint64_t, uint64_t>, journal::Put>> Replay(
    const std::vector<journal::Record>& records) {
  std::map<std::pair<uint64_t, uint64_t>, journal::Put> live;
  uint64_t last_seq = 0;
  for (size_t i = 1; i < records.size(); ++i) {
    const journal::Record& r = records[i];
    if (r.seq() < last_seq) {
      return absl::DataLossError(absl::StrCat("record ", i, " goes back from seq ", last_seq, " to ", r.seq()));
    }
    last_seq = r.seq();
    if (r.has_put()) {
      live[{r.put().session().id(), r.put().request_id()}] = r.put();
    } else if (r.has_forget()) {
      live.erase({r.forget().session_id(), r.forget().request_id()});
    } else {
      return absl::DataLossError(absl::StrCat("record ", i, " is neither a put nor a forget"));
    }
  }
  return live;
}

// A slab fd from the store, checked once: the pool's seals, a whole number of pages.
struct SlabFd {
  UniqueFd fd;
  uint64_t pages = 0;
  std::string problem;  // empty: usable
  bool used = false;
};

SlabFd CheckSlab(UniqueFd fd, uint64_t page_bytes) {
  SlabFd s;
  s.fd = std::move(fd);
  if (absl::Status seals = CheckSizeSeals(s.fd.get()); !seals.ok()) {
    s.problem = std::string(seals.message());
    return s;
  }
  absl::StatusOr<size_t> size = FileSize(s.fd.get());
  if (!size.ok() || *size == 0 || *size % page_bytes != 0) {
    s.problem = absl::StrCat("its size is not a whole number of pages of ", page_bytes);
    return s;
  }
  s.pages = *size / page_bytes;
  return s;
}

// Why `put` cannot be restored with `slabs`, or empty.
std::string ProblemOf(const journal::Put& put, uint64_t page_bytes, std::map<uint64_t, SlabFd>& slabs) {
  const journal::Session& s = put.session();
  const v1::Geometry& g = s.geometry();
  if (g.record_bytes() == 0 || s.records_per_page() != page_bytes / g.record_bytes() || s.records_per_page() == 0) {
    return absl::StrCat("its layout (", g.record_bytes(), "-byte records, ", s.records_per_page(),
                        " per page) does not fit pages of ", page_bytes, " bytes");
  }
  if (g.num_layers() == 0 || put.layers_size() != static_cast<int>(g.num_layers())) {
    return absl::StrCat("it has ", put.layers_size(), " layers of pages, its geometry ", g.num_layers());
  }
  const int per_layer = put.layers(0).slab_size();
  if (per_layer == 0 || static_cast<uint32_t>(per_layer) > s.pages_per_entry() ||
      uint64_t{put.capacity_tokens()} > uint64_t(per_layer) * s.records_per_page()) {
    return absl::StrCat("its ", per_layer, " pages per layer do not hold its ", put.capacity_tokens(), " tokens");
  }
  for (const journal::Layer& layer : put.layers()) {
    if (layer.slab_size() != per_layer || layer.index_size() != per_layer) return "its layers differ in pages";
    for (int i = 0; i < per_layer; ++i) {
      auto it = slabs.find(layer.slab(i));
      if (it == slabs.end()) return absl::StrCat("slab ", layer.slab(i), " is missing from the fd store");
      if (!it->second.problem.empty())
        return absl::StrCat("slab ", layer.slab(i), " is unusable: ", it->second.problem);
      if (layer.index(i) >= it->second.pages) {
        return absl::StrCat("page ", layer.index(i), " lies outside slab ", layer.slab(i), " (", it->second.pages,
                            " pages)");
      }
    }
  }
  return "";
}

}  // namespace

std::string RequestJournal::SlabName(uint64_t id) { return absl::StrCat(kSlabPrefix, absl::Hex(id)); }

uint32_t RequestJournal::Crc32c(const uint8_t* data, size_t size) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t c = ~0u;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

std::string RequestJournal::Frame(const journal::Record& record) {
  const std::string body = record.SerializeAsString();
  const uint32_t len = static_cast<uint32_t>(body.size());
  const uint32_t crc = Crc32c(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  std::string out(kFrameHeader, '\0');
  std::memcpy(out.data(), &len, sizeof(len));
  std::memcpy(out.data() + 4, &crc, sizeof(crc));
  out += body;
  return out;
}

RequestJournal::RequestJournal(std::unique_ptr<FdStore> store, journal::Header header) : store_(std::move(store)) {
  absl::MutexLock lock(&mu_);
  header_ = std::move(header);
}

RequestJournal::~RequestJournal() = default;

absl::StatusOr<std::unique_ptr<RequestJournal>> RequestJournal::Start(std::unique_ptr<FdStore> store,
                                                                      const journal::Header& header,
                                                                      const std::vector<journal::Put>& initial,
                                                                      const std::set<uint64_t>& stored_slabs,
                                                                      const std::vector<std::string>& stale_names) {
  if (store == nullptr) return absl::InvalidArgumentError("a request journal needs an fd store");
  std::unique_ptr<RequestJournal> j(new RequestJournal(std::move(store), header));
  {
    absl::MutexLock lock(&j->slabs_mu_);
    j->claimed_.insert(stored_slabs.begin(), stored_slabs.end());
  }
  DeferredLog log;  // written once the lock is released
  absl::MutexLock lock(&j->mu_);
  for (const journal::Put& put : initial) {
    journal::Record r;
    *r.mutable_put() = put;  // seq 0: anything this life decides is newer
    std::string framed = Frame(r);
    j->live_bytes_ += framed.size();
    j->live_[JournalKey{put.session().id(), put.request_id()}] = Live{0, std::move(framed)};
  }
  HS_RETURN_IF_ERROR(j->CompactLocked());
  for (const std::string& name : stale_names) {
    if (absl::Status st = j->store_->Remove(name); !st.ok())
      DEFERRED_LOG(log, WARNING) << "fd store: removing " << name << ": " << st;
  }
  return j;
}

bool RequestJournal::ClaimSlab(uint64_t id) {
  DeferredLog log;  // written once the lock is released
  absl::MutexLock lock(&slabs_mu_);
  if (claimed_.count(id) != 0) return false;
  if (claimed_.size() >= kMaxStoredSlabs) {
    // Its requests are journaled, but a restart will not find this slab: they are lost then.
    if (unstored_slabs_++ == 0) {
      DEFERRED_LOG(log, WARNING)
          << "request journal: " << kMaxStoredSlabs
          << " slabs are in the fd store already; durable requests on newer slabs will not survive a "
             "restart of the daemon (hisparse_journal_unstored_slabs_total counts them)";
    }
    return false;
  }
  claimed_.insert(id);
  unstored_claims_.insert(id);
  return true;
}

void RequestJournal::UnclaimSlab(uint64_t id) {
  absl::MutexLock lock(&slabs_mu_);
  claimed_.erase(id);
  unstored_claims_.erase(id);
}

void RequestJournal::SlabGone(uint64_t id) {
  {
    absl::MutexLock lock(&slabs_mu_);
    if (claimed_.erase(id) == 0) return;
    // Claimed but not stored yet: StoreSlabs removes it once its Put is done.
    if (unstored_claims_.count(id) != 0) {
      gone_before_stored_.insert(id);
      return;
    }
  }
  if (absl::Status st = store_->Remove(SlabName(id)); !st.ok()) {
    LOG(WARNING) << "fd store: removing slab " << id << ": " << st;
  }
}

absl::Status RequestJournal::StoreSlabs(std::vector<JournalBatch::NewSlab>& slabs) {
  absl::Status first;
  for (JournalBatch::NewSlab& slab : slabs) {
    absl::Status st = store_->Put(SlabName(slab.id), slab.fd.get());
    if (!st.ok() && first.ok()) first = st;
    slab.fd.Reset();
    // Dropped by the pool meanwhile (SlabGone ran before this Put): out again.
    bool gone = false;
    {
      absl::MutexLock lock(&slabs_mu_);
      unstored_claims_.erase(slab.id);
      gone = gone_before_stored_.erase(slab.id) != 0;
    }
    if (gone) (void)store_->Remove(SlabName(slab.id));
  }
  if (!slabs.empty()) {
    // The store has every slab before any record names it: a crash right after cannot leave a
    // record whose slab the store never got.
    if (absl::Status st = store_->Barrier(); !st.ok() && first.ok()) first = st;
  }
  return first;
}

absl::Status RequestJournal::Commit(JournalBatch batch) {
  struct Turn {
    const uint64_t* committing;
    uint64_t ticket;
    bool Ready() const { return *committing == ticket; }
  };
  {
    absl::MutexLock lock(&mu_);
    const Turn turn{&committing_, batch.ticket};
    mu_.Await(absl::Condition(&turn, &Turn::Ready));
  }
  // Our turn: later tickets wait for committing_ to move, so the slabs and records below go out
  // in decision order.
  absl::Status result = StoreSlabs(batch.slabs);
  absl::MutexLock lock(&mu_);
  std::string bytes;
  for (const journal::Record& r : batch.records) {
    std::string framed = Frame(r);
    bytes += framed;
    if (r.has_put()) {
      const JournalKey key{r.put().session().id(), r.put().request_id()};
      auto [it, added] = live_.try_emplace(key);
      if (!added) live_bytes_ -= it->second.framed.size();
      live_bytes_ += framed.size();
      it->second = Live{r.seq(), std::move(framed)};
    } else if (r.has_forget()) {
      auto it = live_.find(JournalKey{r.forget().session_id(), r.forget().request_id()});
      if (it != live_.end()) {
        live_bytes_ -= it->second.framed.size();
        live_.erase(it);
      }
    }
  }
  absl::Status appended = AppendLocked(bytes);
  if (!appended.ok()) {
    if (result.ok()) result = appended;
    // A write cut short leaves part of a frame past end_, which a restart would read as damage
    // before the end: cut it off. The file now lacks this batch: the whole live state is written
    // afresh (a new generation), now or at a later commit.
    (void)::ftruncate(fd_.get(), static_cast<off_t>(end_));
    rewrite_ = true;
  }
  if (rewrite_ || end_ > 2 * live_bytes_ + kCompactSlackBytes) {
    if (absl::Status st = CompactLocked(); !st.ok() && result.ok()) result = st;
  }
  if (!result.ok()) ++failures_;
  ++committing_;
  committed_.store(committing_ - 1, std::memory_order_release);
  return result;
}

void RequestJournal::WaitCommitted(uint64_t ticket) {
  if (committed() >= ticket) return;
  struct Done {
    const uint64_t* committing;
    uint64_t ticket;
    bool Ready() const { return *committing > ticket; }
  };
  absl::MutexLock lock(&mu_);
  const Done done{&committing_, ticket};
  mu_.Await(absl::Condition(&done, &Done::Ready));
}

absl::Status RequestJournal::AppendLocked(const std::string& bytes) {
  if (bytes.empty()) return absl::OkStatus();
  HS_RETURN_IF_ERROR(WriteAll(fd_.get(), bytes, end_));
  end_ += bytes.size();
  return absl::OkStatus();
}

absl::Status RequestJournal::CompactLocked() {
  HS_ASSIGN_OR_RETURN(UniqueFd fd, NewJournalMemfd());
  const bool first = !fd_.valid();
  journal::Record head;
  *head.mutable_header() = header_;
  if (!first) head.mutable_header()->set_generation(header_.generation() + 1);
  std::vector<const Live*> order;
  order.reserve(live_.size());
  for (const auto& [key, live] : live_) order.push_back(&live);
  std::sort(order.begin(), order.end(), [](const Live* a, const Live* b) { return a->seq < b->seq; });
  std::string bytes = Frame(head);
  for (const Live* live : order) bytes += live->framed;
  HS_RETURN_IF_ERROR(WriteAll(fd.get(), bytes, 0));
  const uint64_t generation = head.header().generation();
  HS_RETURN_IF_ERROR(store_->Put(JournalName(generation), fd.get()));
  HS_RETURN_IF_ERROR(store_->Barrier());
  if (!first) {
    if (absl::Status st = store_->Remove(JournalName(header_.generation())); !st.ok()) {
      LOG(WARNING) << "fd store: removing journal generation " << header_.generation() << ": " << st;
    }
    ++compactions_;
  }
  header_ = head.header();
  fd_ = std::move(fd);
  end_ = bytes.size();
  rewrite_ = false;
  return absl::OkStatus();
}

void RequestJournal::NoteRecovery(uint64_t recovered, uint64_t dropped, bool refused, double seconds) {
  absl::MutexLock lock(&mu_);
  recovery_seconds_ = seconds;
  recovered_ = recovered;
  dropped_ = dropped;
  refused_ = refused;
}

RequestJournal::Stats RequestJournal::GetStats() const {
  Stats out;
  {
    absl::MutexLock lock(&mu_);
    out.generation = header_.generation();
    out.bytes = end_;
    out.live_requests = live_.size();
    out.compactions = compactions_;
    out.failures = failures_;
    out.recovered_requests = recovered_;
    out.dropped_requests = dropped_;
    out.refused = refused_;
    out.recovery_seconds = recovery_seconds_;
  }
  absl::MutexLock lock(&slabs_mu_);
  out.stored_slabs = claimed_.size();
  out.unstored_slabs = unstored_slabs_;
  return out;
}

namespace {

using RequestKey = std::pair<uint64_t, uint64_t>;  // (session, request)

// The fds a former daemon left, by kind: its slabs by id, each checked, and its journals, newest
// first. An unknown or duplicate name goes to plan.stale_names (its fd closes with the vector).
struct StoredFds {
  std::map<uint64_t, SlabFd> slabs;
  std::map<uint64_t, ListenFd, std::greater<>> journals;
};

StoredFds SortStoredFds(std::vector<ListenFd> fds, uint64_t page_bytes, RecoveryPlan& plan) {
  StoredFds out;
  for (ListenFd& f : fds) {
    uint64_t n = 0;
    if (NumberAfter(f.name, kSlabPrefix, 16, &n) && n != 0 && out.slabs.count(n) == 0) {
      out.slabs[n] = CheckSlab(std::move(f.fd), page_bytes);
    } else if (NumberAfter(f.name, kJournalPrefix, 10, &n) && out.journals.count(n) == 0) {
      out.journals.emplace(n, std::move(f));
    } else {
      plan.stale_names.push_back(f.name);  // unknown, or a duplicate: its fd closes here
    }
  }
  return out;
}

// The live requests of the newest journal, if it reads whole and was written for this daemon;
// sets plan.found, plan.header and, for a journal it cannot take, plan.refused. Every journal is
// stale after this: the new life writes its own generation.
std::map<RequestKey, journal::Put> ReadNewestJournal(std::map<uint64_t, ListenFd, std::greater<>>& journals,
                                                     uint64_t page_bytes, RecoveryPlan& plan) {
  absl::StatusOr<ReadJournal> taken = absl::NotFoundError("no journal");
  for (auto& [generation, f] : journals) {
    plan.stale_names.push_back(f.name);
    if (plan.found) continue;
    plan.found = true;
    absl::StatusOr<std::string> bytes = ReadAll(f.fd.get());
    taken = bytes.ok() ? ParseFrames(*bytes) : bytes.status();
    if (taken.ok()) plan.header = taken->records.front().header();
    if (!taken.ok()) plan.refused = absl::StrCat(f.name, " cannot be read: ", taken.status().message());
  }
  if (!plan.found || !plan.refused.empty()) return {};
  if (plan.header.format() != RequestJournal::kFormat) {
    plan.refused =
        absl::StrCat("its format is ", plan.header.format(), ", this daemon reads ", RequestJournal::kFormat);
    return {};
  }
  if (plan.header.page_bytes() != page_bytes) {
    plan.refused = absl::StrCat("it was written for pages of ", plan.header.page_bytes(),
                                " bytes and host_pool.page_size is ", page_bytes, " now");
    return {};
  }
  absl::StatusOr<std::map<RequestKey, journal::Put>> replayed = Replay(taken->records);
  if (!replayed.ok()) {
    plan.refused = std::string(replayed.status().message());
    return {};
  }
  if (taken->torn_tail) plan.dropped.push_back("the journal's last commit was cut short by the end; ignored");
  return *std::move(replayed);
}

// Each request against its lease, its layout and its slabs, by session; each slab to one session
// (*slab_owner). A slab two sessions claim refuses the journal: then no request is kept. The
// requests are moved out of `live`.
std::map<uint64_t, std::vector<journal::Put>> CheckRequests(std::map<RequestKey, journal::Put>& live,
                                                            uint64_t page_bytes, std::map<uint64_t, SlabFd>& slabs,
                                                            absl::Time now, RecoveryPlan& plan,
                                                            std::map<uint64_t, uint64_t>* slab_owner) {
  std::map<uint64_t, std::vector<journal::Put>> by_session;
  for (auto& [key, put] : live) {
    const auto [session, request] = key;
    if (absl::FromUnixNanos(put.lease_end_unix_nanos()) <= now) {
      ++plan.expired;
      ++plan.dropped_requests;
      plan.dropped.push_back(absl::StrCat("request ", request, " of session ", session, ": its lease ended"));
      continue;
    }
    if (std::string problem = ProblemOf(put, page_bytes, slabs); !problem.empty()) {
      ++plan.dropped_requests;
      plan.dropped.push_back(absl::StrCat("request ", request, " of session ", session, ": ", problem));
      continue;
    }
    for (const journal::Layer& layer : put.layers()) {
      for (uint64_t slab : layer.slab()) {
        auto [it, added] = slab_owner->emplace(slab, session);
        if (!added && it->second != session && plan.refused.empty()) {
          plan.refused = absl::StrCat("slab ", slab, " holds pages of sessions ", it->second, " and ", session);
        }
      }
    }
    by_session[session].push_back(std::move(put));
  }
  if (!plan.refused.empty()) {
    for (const auto& [session, puts] : by_session) plan.dropped_requests += puts.size();
    by_session.clear();
  }
  return by_session;
}

// Whole sessions, oldest first, while `budget_bytes` holds their slabs: their requests go to
// plan.puts (moved out of `by_session`). Returns, for each slab taken, how many of them hold each
// of its pages.
std::map<uint64_t, std::vector<uint32_t>> TakeWithinBudget(std::map<uint64_t, std::vector<journal::Put>>& by_session,
                                                           const std::map<uint64_t, SlabFd>& slabs, uint64_t page_bytes,
                                                           uint64_t budget_bytes, RecoveryPlan& plan) {
  uint64_t bytes = 0;
  std::map<uint64_t, std::vector<uint32_t>> refs;
  for (auto& [session, puts] : by_session) {
    std::set<uint64_t> own;
    for (const journal::Put& put : puts) {
      for (const journal::Layer& layer : put.layers()) own.insert(layer.slab().begin(), layer.slab().end());
    }
    uint64_t need = 0;
    for (uint64_t slab : own) need += slabs.at(slab).pages * page_bytes;
    if (bytes + need > budget_bytes) {
      plan.dropped.push_back(absl::StrCat("session ", session, "'s ", puts.size(), " requests: their ", need,
                                          " bytes of slabs exceed what is left of host_pool.size"));
      plan.dropped_requests += puts.size();
      continue;
    }
    bytes += need;
    for (uint64_t slab : own) refs[slab].assign(slabs.at(slab).pages, 0);
    for (journal::Put& put : puts) {
      for (const journal::Layer& layer : put.layers()) {
        for (int i = 0; i < layer.slab_size(); ++i) ++refs[layer.slab(i)][layer.index(i)];
      }
      plan.puts.push_back(std::move(put));
    }
  }
  return refs;
}

}  // namespace

RecoveryPlan PlanRecovery(std::vector<ListenFd> fds, uint64_t page_bytes, uint64_t budget_bytes, absl::Time now) {
  RecoveryPlan plan;
  StoredFds stored = SortStoredFds(std::move(fds), page_bytes, plan);
  std::map<RequestKey, journal::Put> live = ReadNewestJournal(stored.journals, page_bytes, plan);
  std::map<uint64_t, uint64_t> slab_owner;
  std::map<uint64_t, std::vector<journal::Put>> by_session =
      CheckRequests(live, page_bytes, stored.slabs, now, plan, &slab_owner);
  std::map<uint64_t, std::vector<uint32_t>> refs =
      TakeWithinBudget(by_session, stored.slabs, page_bytes, budget_bytes, plan);
  // The slabs a kept request holds go back to the pool; the others are unused.
  for (auto& [id, slab] : stored.slabs) {
    auto r = refs.find(id);
    if (r == refs.end()) {
      plan.unused.emplace_back(RequestJournal::SlabName(id), std::move(slab.fd));
      continue;
    }
    PagePool::RecoveredSlab out;
    out.id = id;
    out.owner = slab_owner.at(id);
    out.fd = std::move(slab.fd);
    out.refs = std::move(r->second);
    plan.slabs.push_back(std::move(out));
  }
  return plan;
}

}  // namespace hisparse
